"""Settings of ``bench/scale.py``: the benchmark project with production-like lease timing.

Environment (all optional; ``bench/scale.py`` sets them for its workers):

- ``DATABASE_URL``: the database (``bench.settings``);
- ``SCALE_PARTITIONS`` (default 4096): partitions of the topic ``bench.scale``;
- ``SCALE_LEASE_DURATION`` (30), ``SCALE_LEASE_RENEW_INTERVAL`` (10), ``SCALE_POLL_INTERVAL``
  (0.1), ``SCALE_POLL_INTERVAL_MAX`` (1.0): ``SQLQUEUE``'s defaults unless given, i.e. what
  a deployment gets out of the box.
"""

from __future__ import annotations

from bench.settings import *  # noqa: F403
from bench.settings import SQLQUEUE as _BENCH_SQLQUEUE
from bench.settings import env
from django_sqlqueue import conf as _conf

SQLQUEUE = {
    "LEASE_DURATION": env.float("SCALE_LEASE_DURATION", default=_conf.DEFAULT_LEASE_DURATION),
    "LEASE_RENEW_INTERVAL": env.float("SCALE_LEASE_RENEW_INTERVAL", default=_conf.DEFAULT_LEASE_RENEW_INTERVAL),
    "POLL_INTERVAL": env.float("SCALE_POLL_INTERVAL", default=_conf.DEFAULT_POLL_INTERVAL),
    "POLL_INTERVAL_MAX": env.float("SCALE_POLL_INTERVAL_MAX", default=_conf.DEFAULT_POLL_INTERVAL_MAX),
    "TOPICS": {
        **_BENCH_SQLQUEUE["TOPICS"],
        "bench.scale": {"partitions": env.int("SCALE_PARTITIONS", default=4096)},
    },
}
