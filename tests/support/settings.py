"""Test settings: the test project, on MariaDB/MySQL unless DATABASE_URL says otherwise.

The suite proves locking and ordering claims, which need a real server: it defaults to
the local MariaDB that ``.ci/test`` starts.
"""

import os
from pathlib import Path

os.environ.setdefault("DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue")

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS, SQLQUEUE

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.consumerapp"]

_default = DATABASES["default"]
if _default["ENGINE"].endswith("sqlite3"):
    # A test database file next to the configured one, never :memory:, so the runconsumer
    # subprocesses of tests/processes/test_processes.py open the same database as the test.
    _name = Path(_default["NAME"])
    _default.setdefault("TEST", {}).setdefault("NAME", str(_name.with_name(f"test_{_name.name}")))

# A second alias on the same database, for tests of publish() next to another alias's
# transaction (the outbox warning).
DATABASES = {
    **DATABASES,
    "other": {**DATABASES["default"], "TEST": {**DATABASES["default"].get("TEST", {}), "MIRROR": "default"}},
}
INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.seqapp"]

#: Topics of the process tests with a partition count of their own (the same in
#: tests/support/process_settings.py, which the runconsumer processes use).
TEST_TOPICS = {"seq.one": {"partitions": 1}, "seq.perkey": {"per_key": True}}
SQLQUEUE = {**SQLQUEUE, "TOPICS": TEST_TOPICS}

# Issue 10: the django.tasks backend's test app (tasks, consumers, Run rows). TASKS is set
# by the task tests themselves (tests/test_tasks*.py) and by tests/support/taskapp/process_settings.py.
INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.taskapp"]
