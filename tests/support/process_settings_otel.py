"""Settings of the runconsumer processes of tests/processes/test_tracing.py: the fast clocks of
tests/support/process_settings.py, the tracing tests' consumers, and an OpenTelemetry SDK whose finished
spans are appended to the file named by ``SQLQUEUE_TEST_SPANS``."""

import os

from tests.support.otelapp.spans import install
from tests.support.process_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.otelapp"]  # noqa: F405

install(os.environ["SQLQUEUE_TEST_SPANS"])
