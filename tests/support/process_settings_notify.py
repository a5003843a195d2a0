"""Settings of the runconsumer processes of tests/worker/threads/test_listener.py and tests/worker/test_probe.py:
long poll intervals (``SQLQUEUE_TEST_POLL``, default 300 s), so that only a notification (or a
short look) can make a worker look soon after a publish; ``SQLQUEUE_TEST_NOTIFY=0`` turns
notifications off."""

import os

from tests.support.process_settings import *  # noqa: F403
from tests.support.process_settings import SQLQUEUE

_poll = float(os.environ.get("SQLQUEUE_TEST_POLL", "300"))
SQLQUEUE = {
    **SQLQUEUE,
    "POLL_INTERVAL": _poll,
    "POLL_INTERVAL_MAX": float(os.environ.get("SQLQUEUE_TEST_POLL_MAX", str(_poll))),
    "NOTIFY": os.environ.get("SQLQUEUE_TEST_NOTIFY", "1") == "1",
}
