"""Settings of runconsumer processes serving two databases (issue 32): the process settings,
plus the consumers of ``first.events`` and ``second.events`` (tests/support/secondapp).

``SQLQUEUE_TEST_SECOND_URL`` (set by the test) points the alias ``second`` at the test's second
database -- on the suite's server (its test database test_<name>_second, or SQLite file), or
on a server the test started itself (tests/chaos/test_databases.py).
"""

import os

from testproject.settings import database_config
from tests.support.process_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.secondapp"]  # noqa: F405

if os.environ.get("SQLQUEUE_TEST_SECOND_URL"):
    DATABASES = {**DATABASES, "second": database_config(os.environ["SQLQUEUE_TEST_SECOND_URL"])}  # noqa: F405
