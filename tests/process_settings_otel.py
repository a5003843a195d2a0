"""Settings of the runconsumer processes of tests/test_tracing_processes.py: the fast clocks of
tests/process_settings.py, the tracing tests' consumers, and an OpenTelemetry SDK whose finished
spans are appended to the file named by ``SQLQUEUE_TEST_SPANS``."""

import os

from tests.otelapp.spans import install
from tests.process_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.otelapp"]  # noqa: F405

install(os.environ["SQLQUEUE_TEST_SPANS"])
