"""Settings of ``bench/hung.py``'s workers: the checkout's test project plus this app.

The issue's case: ``VISIBILITY_TIMEOUT`` 3 s (the consumer's), ``LEASE_DURATION`` 3 s.
"""

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "sqlqueue_hungbench"]
SQLQUEUE = {
    "POLL_INTERVAL": 0.05,
    "POLL_INTERVAL_MAX": 0.5,
    "LEASE_DURATION": 3,
    "LEASE_RENEW_INTERVAL": 0.5,
    "BACKOFF_MIN": 0.5,
    "BACKOFF_MAX": 2,
    "TOPICS": {"bench.hung": {"partitions": 8}},
}
