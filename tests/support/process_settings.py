"""Settings of the runconsumer processes started by tests/processes/test_processes.py: fast clocks.

``SQLQUEUE_TEST_TOPICS`` (JSON, set by a test) gives topics their partition counts, the
same as the test process publishes with.
"""

import json
import os

from tests.support.settings import *  # noqa: F403

SQLQUEUE = {
    "POLL_INTERVAL": 0.02,
    "POLL_INTERVAL_MAX": 0.1,
    "LEASE_DURATION": 3,
    "LEASE_RENEW_INTERVAL": 0.5,
    "BACKOFF_MIN": 0.1,
    "BACKOFF_MAX": 0.3,
    "GC_INTERVAL": 1,
    "TOPICS": TEST_TOPICS,  # noqa: F405
    "TOPIC_DATABASES": SECOND_ROUTES,  # noqa: F405
}

if os.environ.get("SQLQUEUE_TEST_TOPICS"):
    SQLQUEUE["TOPICS"] = {**TEST_TOPICS, **json.loads(os.environ["SQLQUEUE_TEST_TOPICS"])}  # noqa: F405
