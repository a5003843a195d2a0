"""Which partition a message goes to.

A topic has a fixed number of partitions (``SQLQUEUE["PARTITIONS"]``, or
``SQLQUEUE["TOPICS"][topic]["partitions"]``). A message's key -- its ordering scope: an
order id, a customer id -- is hashed to one of them::

    partition = crc32(utf8(key)) % partitions

CRC-32 (IEEE 802.3, as ``zlib.crc32``, Java's ``java.util.zip.CRC32`` and Spark SQL's
``crc32()``) is unsigned and the same in every process, on every Python version and
platform, and in a Spark job: ``pmod(crc32(key), partitions)``. Python's ``hash()`` is
salted per process and must never be used for this.

A message without a key ("") goes to any partition: each process spreads its unkeyed
messages round-robin from a random start, so no partition (and no worker) gets them all.

A topic with one partition per key (``{"per_key": True}``) uses ``crc32(utf8(key))``
itself as the partition number, so every key is ordered and leased on its own (two keys
share a partition only on a CRC collision: they are then serialized together, nothing
else happens).
"""

from __future__ import annotations

import itertools
import random
import threading
import zlib

#: Partition numbers of per-key topics lie in [0, 2**32).
PER_KEY_SPACE = 2**32


def key_hash(key: str) -> int:
    """Return the unsigned CRC-32 of the key's UTF-8 bytes."""
    return zlib.crc32(key.encode("utf-8"))


class _RoundRobin:
    """A thread-safe counter starting at a random point."""

    def __init__(self) -> None:
        self._counter = itertools.count(random.randrange(1 << 30))
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            return next(self._counter)


_spread = _RoundRobin()


def partition_for(key: str, partitions: int | None) -> int:
    """Return the partition of a message with ``key`` in a topic of ``partitions``.

    ``partitions`` None means one partition per key. An empty key in a hashed topic is
    spread round-robin.
    """
    if partitions is None:
        return key_hash(key)
    if not key:
        return _spread.next() % partitions
    return key_hash(key) % partitions
