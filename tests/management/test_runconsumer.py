"""management/commands/runconsumer.py: the options refused before a worker starts.

Running consumers until SIGTERM: tests/management/test_commands.py; as real processes: tests/processes/.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_sqlqueue.management.commands import runconsumer


@pytest.fixture
def restore_logger() -> Iterator[None]:
    """The command configures the ``django_sqlqueue`` logger before it checks --concurrency."""
    logger = logging.getLogger("django_sqlqueue")
    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers
    logger.propagate = propagate


@pytest.mark.parametrize("port", ["0", "65536"])
def test_a_metrics_port_outside_1_65535_is_refused(port: str) -> None:
    with pytest.raises(CommandError, match=f"--metrics-port must be a TCP port \\(1-65535\\), got {port}"):
        call_command(runconsumer.Command(), "--metrics-port", port)


def test_a_health_file_in_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="its directory does not exist"):
        call_command(runconsumer.Command(), "--health-file", str(tmp_path / "missing" / "alive"))


@pytest.mark.usefixtures("restore_logger")
@pytest.mark.parametrize("given", ["0", "257", "100000"])
def test_concurrency_outside_1_to_256_is_refused(given: str) -> None:
    """Each handler thread holds a database connection; 100000 failed with "can't start new thread"."""
    with pytest.raises(CommandError, match=f"argument --concurrency: must be an integer from 1 to 256, got '{given}'"):
        call_command(runconsumer.Command(), "--concurrency", given)


@pytest.mark.usefixtures("restore_logger")
def test_a_concurrency_given_as_a_keyword_is_checked_too() -> None:
    """``call_command(concurrency=...)`` skips the parser; the command checks it before a worker starts."""
    with pytest.raises(CommandError, match="argument --concurrency: must be an integer from 1 to 256, got 0"):
        call_command(runconsumer.Command(), concurrency=0)
    with pytest.raises(CommandError, match=r"--metrics-port must be a TCP port \(1-65535\), got 70000"):
        call_command(runconsumer.Command(), metrics_port=70000)
