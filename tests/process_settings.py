"""Settings of the runconsumer processes started by tests/test_processes.py: fast clocks."""

from tests.settings import *  # noqa: F401,F403

SQLQUEUE = {
    "POLL_INTERVAL": 0.02,
    "POLL_INTERVAL_MAX": 0.1,
    "LEASE_DURATION": 3,
    "LEASE_RENEW_INTERVAL": 0.5,
    "BACKOFF_MIN": 0.1,
    "BACKOFF_MAX": 0.3,
    "GC_INTERVAL": 1,
}
