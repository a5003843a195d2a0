"""The task processes' settings with one partition per topic (tests/processes/test_limits.py:
a limited task and other tasks in one partition, so in one batch)."""

from tests.support.taskapp.process_settings import *  # noqa: F403
from tests.support.taskapp.process_settings import SQLQUEUE

SQLQUEUE = {**SQLQUEUE, "PARTITIONS": 1}
