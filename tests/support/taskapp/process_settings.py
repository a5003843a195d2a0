"""Settings of the runconsumer processes of the task tests: fast clocks, the tasks backend,
and a schedule firing every second (tests/test_schedules_processes.py)."""

import copy
import os

from tests.support.settings import *  # noqa: F403
from tests.support.taskapp.settings_common import TASKS

if os.environ.get("TSK_MARK_RUNNING_AFTER"):
    TASKS = copy.deepcopy(TASKS)
    TASKS["default"]["OPTIONS"]["MARK_RUNNING_AFTER"] = float(os.environ["TSK_MARK_RUNNING_AFTER"])

if os.environ.get("TSK_PRIORITIES"):  # tests/tasks/test_priorities.py, bench/priorities.py
    TASKS = copy.deepcopy(TASKS)
    TASKS["default"]["OPTIONS"]["PRIORITIES"] = [int(p) for p in os.environ["TSK_PRIORITIES"].split(",")]

SQLQUEUE = {
    "POLL_INTERVAL": 0.02,
    "POLL_INTERVAL_MAX": 0.1,
    "LEASE_DURATION": 3,
    "LEASE_RENEW_INTERVAL": 0.5,
    "VISIBILITY_TIMEOUT": float(os.environ.get("TSK_VISIBILITY_TIMEOUT", "30")),
    "BACKOFF_MIN": 0.1,
    "BACKOFF_MAX": 0.3,
    "GC_INTERVAL": 1,
}
if os.environ.get("TSK_SCHEDULE"):
    SQLQUEUE["SCHEDULES"] = {
        "tsk-every-second": {"cron": "* * * * * *", "task": "tests.support.taskapp.tasks.tick", "args": ["tick"]},
        "tsk-message": {"cron": "* * * * * *", "topic": "tsk.ticks", "payload": {"hello": "tick"}},
    }
