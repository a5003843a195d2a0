"""Settings of the consumption benchmarks: the test project plus ``bench.benchapp``.

Environment (all optional):

- ``DATABASE_URL``: the database (read by ``testproject.settings``; ``bench/consume.py`` points
  it at the dedicated ``sqlqueue_bench`` database);
- ``SQLQUEUE_POLL_INTERVAL`` (default 0.01), ``SQLQUEUE_POLL_INTERVAL_MAX`` (default 0.05),
  ``SQLQUEUE_BATCH_SIZE`` (default 100), ``SQLQUEUE_NOTIFY`` (default on: PostgreSQL's
  notifications);
- ``BENCH_PARTITIONS`` (default 8): partitions of the benchmark topics ``bench.drain`` and
  ``bench.latency`` (``SQLQUEUE["TOPICS"]``); keys are hashed to them;
- ``BENCH_CONN_MAX_AGE``: Django's ``CONN_MAX_AGE`` for the worker's connection ("none" = keep
  it open forever; unset = Django's default, 0, which is what a project gets out of the box);
- ``BENCH_OTEL=1``: an OpenTelemetry SDK tracer provider (``bench/overhead.py``), sampling
  ``BENCH_OTEL_RATIO`` of the traces (default 1: all).
"""

from __future__ import annotations

from testproject.settings import *  # noqa: F403
from testproject.settings import BASE_DIR, INSTALLED_APPS, database_config, env

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]

DATABASES = {"default": database_config(env.str("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"))}
_conn_max_age = env.str("BENCH_CONN_MAX_AGE", default="")
if _conn_max_age:
    DATABASES["default"]["CONN_MAX_AGE"] = None if _conn_max_age.lower() == "none" else int(_conn_max_age)

SQLQUEUE = {
    "POLL_INTERVAL": env.float("SQLQUEUE_POLL_INTERVAL", default=0.01),
    "POLL_INTERVAL_MAX": env.float("SQLQUEUE_POLL_INTERVAL_MAX", default=0.05),
    # bench/wakeup.py's idle phase: BENCH_DEFAULT_LEASES=1 keeps SQLQUEUE's defaults (30 s / 10 s).
    **({} if env.bool("BENCH_DEFAULT_LEASES", default=False) else {"LEASE_DURATION": 10, "LEASE_RENEW_INTERVAL": 1}),
    "BATCH_SIZE": env.int("SQLQUEUE_BATCH_SIZE", default=100),
    # bench/wakeup.py: notifications on PostgreSQL (SQLQUEUE_NOTIFY=0: polling only).
    "NOTIFY": env.bool("SQLQUEUE_NOTIFY", default=True),
    "TOPICS": {
        topic: {"partitions": env.int("BENCH_PARTITIONS", default=8)} for topic in ("bench.drain", "bench.latency")
    },
}

# bench/overhead.py: BENCH_OTEL=1 gives the worker an OpenTelemetry SDK tracer provider (spans
# counted and dropped, bench/otel_setup.py), so its handlers run in traced process spans.
if env.bool("BENCH_OTEL", default=False):
    from bench.otel_setup import install as _install_otel

    _install_otel(env.float("BENCH_OTEL_RATIO", default=1.0))
