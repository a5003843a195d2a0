"""Keys are hashed to partitions with CRC-32, identically everywhere."""

from __future__ import annotations

import subprocess
import sys
import zlib
from collections import Counter

import pytest

from django_sqlqueue.rules.partitioning import key_hash, partition_for


def test_key_hash_is_crc32_of_utf8():
    # Reference values of CRC-32/ISO-HDLC (the "123456789" check value is 0xCBF43926).
    assert key_hash("123456789") == 0xCBF43926
    assert key_hash("hello") == 907060870
    assert key_hash("") == 0
    assert key_hash("Zürich") == zlib.crc32("Zürich".encode())


def test_partition_is_hash_modulo_partitions():
    assert partition_for("hello", 8) == 907060870 % 8
    assert [partition_for(k, 8) for k in ("a", "b", "c", "d", "alice", "bob")] == [3, 1, 7, 4, 7, 0]
    assert partition_for("hello", 1) == 0


def test_same_key_same_partition_in_another_interpreter():
    """Python's hash() is salted per process; the partition must not be."""
    code = (
        "from django_sqlqueue.rules.partitioning import partition_for; "
        "print([partition_for(f'k{i}', 16) for i in range(50)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"}
    ).stdout
    assert out.strip() == str([partition_for(f"k{i}", 16) for i in range(50)])


def test_unkeyed_messages_are_spread_round_robin():
    counts = Counter(partition_for("", 8) for _ in range(800))
    assert sorted(counts) == list(range(8))
    assert set(counts.values()) == {100}


def test_many_keys_spread_over_partitions():
    counts = Counter(partition_for(f"customer-{i}", 8) for i in range(8000))
    assert sorted(counts) == list(range(8))
    assert min(counts.values()) > 800  # ~1000 each


def test_per_key_partition_is_the_full_hash():
    assert partition_for("hello", None) == 907060870
    assert partition_for("", None) == 0


@pytest.mark.parametrize("key", ["a", "Ünïcödé", "order-42", "x" * 128])
def test_matches_spark_sql_formula(key):
    """Spark SQL's ``pmod(crc32(key), n)`` is CRC-32 of the UTF-8 bytes modulo n."""
    assert partition_for(key, 12) == zlib.crc32(key.encode("utf-8")) % 12
