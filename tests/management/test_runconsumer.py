"""management/commands/runconsumer.py: the options refused before a worker starts, a worker
without consumers, and the log line saying where ``--metrics-port`` serves.

Running consumers until SIGTERM: tests/management/test_commands.py; as real processes: tests/processes/.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_sqlqueue.consumers import load_consumers, registry
from django_sqlqueue.management.commands import runconsumer
from django_sqlqueue.metrics.worker import WorkerMetrics

from ..support.ports import free_port


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


@pytest.fixture
def no_consumers() -> Iterator[None]:
    """An empty consumer registry (the apps' consumers modules are imported already, so
    importing them again registers nothing); the registered consumers come back after."""
    saved = load_consumers()
    for spec in saved:
        registry.unregister(spec.group, spec.topic)
    yield
    for spec in saved:
        registry.register(spec)


@pytest.mark.usefixtures("restore_logger", "no_consumers")
def test_a_worker_without_consumers_says_where_it_looked_and_how_to_declare_one() -> None:
    """Issue 29: 'no registered consumer matches --group * --topic * (registered group:topic pairs: none)'."""
    with pytest.raises(CommandError) as caught:
        call_command(runconsumer.Command())
    message = str(caught.value)
    assert message.startswith("no consumer to run: consumers are the @consumer functions of each installed app's")
    assert "(imported testproject.orders.consumers, tests.support.consumerapp.consumers" in message
    assert "queues of a TASKS backend 'django_sqlqueue.tasks.SQLQueueBackend' (none configured)" in message
    assert "Declare one in <app>/consumers.py of an app in INSTALLED_APPS: `@consumer('orders.created'" in message
    assert "\n" not in message


@pytest.mark.usefixtures("restore_logger")
def test_consumers_that_do_not_match_the_filters_are_listed() -> None:
    with pytest.raises(CommandError, match=r"no registered consumer matches --group \['nobody'\].*billing:orders"):
        call_command(runconsumer.Command(), "--group", "nobody")


@pytest.mark.usefixtures("restore_logger", "second_routes")
def test_an_unknown_database_is_refused_naming_the_known_ones() -> None:
    """Issue 32: --database names the aliases to serve: SQLQUEUE["DATABASE"] and TOPIC_DATABASES's."""
    with pytest.raises(
        CommandError, match=r"--database orders, x: not a database of the queue \(known: default, second;"
    ):
        call_command(runconsumer.Command(), "--database", "orders", "--database", "second", "--database", "x")


@pytest.mark.usefixtures("restore_logger", "second_routes")
def test_a_database_that_none_of_the_selected_consumers_lives_in_is_refused() -> None:
    with pytest.raises(
        CommandError, match=r"no selected consumer has its topic in database second \(they live in: .*-> default"
    ):
        call_command(runconsumer.Command(), "--database", "second", "--group", "billing")


def test_the_worker_metrics_log_where_they_are_served(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 29: no log line said where a worker serves its metrics."""
    caplog.set_level(logging.INFO, logger="django_sqlqueue.metrics.worker")
    port = free_port()
    metrics = WorkerMetrics()
    metrics.start(port, "127.0.0.1")
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "django_sqlqueue.metrics.worker"]
        assert lines == [f"serving metrics on http://127.0.0.1:{port}/metrics"]
    finally:
        metrics.stop()
