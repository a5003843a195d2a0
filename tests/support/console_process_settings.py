"""Settings of the runconsumer processes of the console tests: fast clocks, the console consumers only."""

from tests.support.process_settings import *  # noqa: F403
from tests.support.process_settings import INSTALLED_APPS, SQLQUEUE

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "tests.support.consumerapp"] + ["tests.support.consoleapp"]

# Keep the log while a test runs: a rewind to the earliest message must find every message,
# not only those the workers' GC (every second here) has not deleted yet.
SQLQUEUE = {**SQLQUEUE, "RETENTION": 3600}
