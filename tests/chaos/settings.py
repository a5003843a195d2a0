"""Settings of the chaos suite's processes: the runconsumer workers and the publisher.

``DATABASE_URL`` points at the private server the test started (tests/support/dbservers.py); each
worker slot logs in as a user of its own, so the test can kill that worker's sessions from
the server side. Only the queue and the chaos consumers are installed (not the other test
apps, whose consumers would subscribe to topics of their own).

Short clocks, so that a run with a few dozen faults takes minutes: a lease not renewed for
3 s is taken over, a delivery not acked for 4 s is redelivered.
"""

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_sqlqueue",
    "tests.chaos.chaosapp",
]

#: The topics of the run (tests/chaos/chaosapp/consumers.py consumes them).
EVENTS = "chaos.events"
HANG = "chaos.hang"
EVENT_PARTITIONS = 12
LEASE_DURATION = 3.0
VISIBILITY_TIMEOUT = 4.0

SQLQUEUE = {
    "POLL_INTERVAL": 0.05,
    "POLL_INTERVAL_MAX": 0.2,
    "LEASE_DURATION": LEASE_DURATION,
    "LEASE_RENEW_INTERVAL": 0.5,
    "VISIBILITY_TIMEOUT": VISIBILITY_TIMEOUT,
    "BACKOFF_MIN": 0.1,
    "BACKOFF_MAX": 0.5,
    "GC_INTERVAL": 2,
    "OUTAGE_REPORT_INTERVAL": 5,
    "TOPICS": {EVENTS: {"partitions": EVENT_PARTITIONS}, HANG: {"partitions": 1}},
}

ROOT_URLCONF = "tests.chaos.urls"
MIDDLEWARE = []
