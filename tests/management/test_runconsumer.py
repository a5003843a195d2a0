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
def test_concurrency_below_1_is_refused() -> None:
    with pytest.raises(CommandError, match="--concurrency must be at least 1, got 0"):
        call_command(runconsumer.Command(), "--concurrency", "0")
