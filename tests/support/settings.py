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

# Issue 32: a second queue database with tables of its own (a database of its own on the same
# server: test_<name>_second; a file of its own on SQLite), and the topics routed to it. Tests
# that use it ask for it: @pytest.mark.django_db(databases=["default", "second"]).
_second = {
    **DATABASES["default"],
    "TEST": {k: v for k, v in DATABASES["default"].get("TEST", {}).items() if k != "NAME"},
}
if _second["ENGINE"].endswith("sqlite3"):
    _second["NAME"] = str(Path(_default["NAME"]).with_name(f"second_{Path(_default['NAME']).name}"))
    _second["TEST"]["NAME"] = str(Path(_default["NAME"]).with_name(f"test_second_{Path(_default['NAME']).name}"))
else:
    _second["NAME"] = f"{_default['NAME']}_second"
DATABASES["second"] = _second
#: Topics that live in the "second" database: the runconsumer processes' settings route them
#: (tests/support/process_settings.py); in the test process a test opts in with the
#: ``second_routes`` fixture (tests/conftest.py), so that every other test reads one database.
SECOND_ROUTES = {"second.*": "second"}

#: Topics of the process tests with a partition count of their own (the same in
#: tests/support/process_settings.py, which the runconsumer processes use).
TEST_TOPICS = {"seq.one": {"partitions": 1}, "seq.perkey": {"per_key": True}}
SQLQUEUE = {**SQLQUEUE, "TOPICS": TEST_TOPICS}

# Issue 10: the django.tasks backend's test app (tasks, consumers, Run rows). TASKS is set
# by the task tests themselves (tests/test_tasks*.py) and by tests/support/taskapp/process_settings.py.
INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.taskapp"]
