"""Settings of ``bench/growth.py``: ``bench.settings`` plus the big topic and a long retention.

``BENCH_RETENTION`` (seconds, default 7 days): ``SQLQUEUE["RETENTION"]``, so that neither the
workers' collectors nor anything else deletes the filled log before the GC phase (which runs
in the benchmark's own process with a short retention).
"""

from __future__ import annotations

from bench.settings import *  # noqa: F403
from bench.settings import SQLQUEUE, env

SQLQUEUE = {
    **SQLQUEUE,
    "RETENTION": env.float("BENCH_RETENTION", default=7 * 24 * 3600.0),
    "TOPICS": {**SQLQUEUE["TOPICS"], "bench.growth": {"partitions": 8}, "orders": {"partitions": 8}},
}
