"""Benchmark handlers, registered for ``manage.py runconsumer --group bench``.

- ``bench.drain``: does nothing but count (the cost measured is the queue's, not the handler's).
  ``BENCH_BATCH_SIZE`` (default 100) is its batch size. For ``bench/atomic.py`` (issue 16),
  ``BENCH_DRAIN_WRITE=1`` makes it insert one row into ``bench_effects`` (on the queue's
  database, created by that script), and ``BENCH_ATOMIC`` (``true``, ``batch``; empty: not
  atomic) is its ``atomic=``: the same write, inside the ack's transaction or on its own.
- ``bench.growth``: ``bench/growth.py``'s big topic: no-op for the drain, latency as below for
  messages whose payload has a ``"t"``.
- ``bench.scale`` (group ``scale``): no-op, for ``bench/scale.py`` (the topic stays empty).
- ``bench.latency``: the payload carries the publisher's ``time.time()`` as ``"t"`` (and a run
  label as ``"run"``); the handler appends ``"<run> <latency seconds>"`` to a per-process file in
  ``BENCH_LATENCY_DIR``, flushed after every line, so the record survives the graceful SIGTERM
  shutdown of ``runconsumer`` (and anything short of SIGKILL). Publisher and workers run on the
  same host, so the two ``time.time()`` clocks are the same clock.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from django.db import connection

from django_sqlqueue import consumer

BATCH_SIZE = int(os.environ.get("BENCH_BATCH_SIZE", "100"))

handled = 0


#: bench/atomic.py: the drain handler's write and its atomic= (issue 16).
DRAIN_WRITE = os.environ.get("BENCH_DRAIN_WRITE") == "1"
ATOMIC = {"": False, "true": True, "batch": "batch"}[os.environ.get("BENCH_ATOMIC", "")]
_drain_options: dict[str, Any] = {"atomic": ATOMIC} if ATOMIC else {}


def drain(message) -> None:  # type: ignore[no-untyped-def]
    global handled
    handled += 1


def drain_write(message) -> None:  # type: ignore[no-untyped-def]
    """The same small write whatever the mode: one row, on the queue's database."""
    global handled
    handled += 1
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_effects (message_id) VALUES (%s)", [message.id])


consumer("bench.drain", group="bench", batch_size=BATCH_SIZE, **_drain_options)(drain_write if DRAIN_WRITE else drain)


_latency_file: IO[str] | None = None


def _latency_out() -> IO[str]:
    global _latency_file
    if _latency_file is None:
        directory = Path(os.environ.get("BENCH_LATENCY_DIR", "bench/results/latency"))
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"latency-{socket.gethostname()}-{os.getpid()}.txt"
        _latency_file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    return _latency_file


@consumer("bench.latency", group="bench")
def latency(message) -> None:  # type: ignore[no-untyped-def]
    received = time.time()
    payload = message.payload
    out = _latency_out()
    out.write(f"{payload.get('run', '-')} {received - payload['t']:.6f}\n")
    out.flush()


@consumer("bench.growth", group="bench", batch_size=BATCH_SIZE)
def growth(message) -> None:  # type: ignore[no-untyped-def]
    """``bench/growth.py``: counts the drain's messages; records the latency of those whose
    payload carries the publisher's ``"t"``, as ``bench.latency`` does."""
    global handled
    handled += 1
    payload = message.payload
    if isinstance(payload, dict) and "t" in payload:
        _latency_out().write(f"{payload.get('run', '-')} {time.time() - payload['t']:.6f}\n")


@consumer("bench.scale", group="scale")
def scale(message) -> None:  # type: ignore[no-untyped-def]
    """``bench/scale.py``: the topic stays empty; only leases and idle polling are measured."""
