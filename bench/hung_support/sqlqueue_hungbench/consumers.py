"""``bench.hung`` (group ``hung``): hangs forever on ``{"hang": true}``, else records the id."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from django_sqlqueue import consumer

OUT = Path(os.environ.get("BENCH_HUNG_DIR", "/tmp")) / f"hung-{os.getpid()}.txt"
_out = open(OUT, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process


@consumer("bench.hung", group="hung", batch_size=10, visibility_timeout=3, max_attempts=2)
def handle(message) -> None:  # type: ignore[no-untyped-def]
    if isinstance(message.payload, dict) and message.payload.get("hang"):
        threading.Event().wait()  # an HTTP call without a timeout
    _out.write(f"{message.id}\n")
