"""Where worker log records go: the project's LOGGING unless ``-v`` is given (django_sqlqueue.worker.logsetup)."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_sqlqueue import publish, publish_many
from django_sqlqueue.conf import DEFAULT_PARTITIONS as PARTITIONS
from django_sqlqueue.rules.partitioning import partition_for
from django_sqlqueue.worker.logsetup import configure_worker_logging
from tests.support.consumerapp.models import Handled

from ..support.engine_helpers import caught_up, dead_letters, wait_until

TOPIC = "proc.events"


@pytest.fixture
def clean_logging() -> Iterator[tuple[logging.Logger, logging.Logger]]:
    """Root and django_sqlqueue loggers with no handlers and no level; restored afterwards."""
    root, ours = logging.getLogger(), logging.getLogger("django_sqlqueue")
    saved = [(lg, lg.level, list(lg.handlers), lg.propagate) for lg in (root, ours)]
    for lg in (root, ours):
        lg.handlers[:] = []
    ours.setLevel(logging.NOTSET)
    root.setLevel(logging.WARNING)
    yield root, ours
    for lg, level, handlers, propagate in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate = propagate


def test_without_v_and_without_any_handler_a_stderr_handler_shows_info(clean_logging, monkeypatch):
    root, ours = clean_logging
    monkeypatch.setattr(root, "handlers", [])  # pytest's own capture handler, added for the test call
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_worker_logging(None)
    logging.getLogger("django_sqlqueue.worker").info("worker starting x=1")
    logging.getLogger("django_sqlqueue.worker").debug("poll x=1")
    assert "INFO django_sqlqueue.worker worker starting x=1" in stream.getvalue()
    assert "poll" not in stream.getvalue()
    assert ours.propagate is True


def test_without_v_a_root_only_config_is_left_alone(clean_logging):
    root, ours = clean_logging
    root.addHandler(logging.NullHandler())
    configure_worker_logging(None)
    assert ours.handlers == [] and ours.level == logging.NOTSET and ours.propagate is True


def test_explicit_v_sets_the_level_and_reuses_a_console_handler(clean_logging, monkeypatch):
    root, ours = clean_logging
    console = logging.StreamHandler(sys.stderr)
    root.addHandler(console)
    configure_worker_logging(2)
    assert ours.level == logging.DEBUG and ours.handlers == [] and ours.propagate is True
    configure_worker_logging(0)
    assert ours.level == logging.WARNING
    configure_worker_logging(1)
    assert ours.level == logging.INFO


def test_explicit_v_adds_a_stderr_handler_when_none_reaches_the_console(clean_logging, tmp_path, monkeypatch):
    root, ours = clean_logging
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    root.addHandler(logging.FileHandler(tmp_path / "root.log"))
    configure_worker_logging(3)
    configure_worker_logging(3)  # idempotent: one handler
    assert len(ours.handlers) == 1 and ours.level == logging.DEBUG
    logging.getLogger("django_sqlqueue.worker.threads.leasing").debug("renewed leases x=1")
    assert "DEBUG django_sqlqueue.worker.threads.leasing renewed leases x=1" in stream.getvalue()
    for handler in root.handlers:
        handler.flush()
    assert "renewed leases x=1" in (tmp_path / "root.log").read_text()  # still propagates


@pytest.mark.slow
def test_root_only_logging_receives_the_worker_records_and_failures_with_tracebacks(runconsumer, tmp_path):
    logfile = tmp_path / "root.log"
    publish(TOPIC, {"fail": ["g1"]}, key="p0", id="doomed")
    publish_many(TOPIC, [{"payload": {"i": i}, "key": "p1"} for i in range(3)])
    process = runconsumer(
        "rootlog",
        "--group",
        "g1",
        "--topic",
        TOPIC,
        settings="tests.support.process_settings_rootlog",
        verbosity=None,
        env={"SQLQUEUE_TEST_LOGFILE": str(logfile)},
    )
    wait_until(lambda: dead_letters(f"{TOPIC}_dlq"), timeout=30, what="the failing message dead-lettered")
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="g1 caught up")
    assert process.terminate() == 0

    text = logfile.read_text()
    assert "ROOT INFO django_sqlqueue.worker.loop worker starting subscriber=rootlog" in text
    assert "ROOT INFO django_sqlqueue.worker.threads.leasing acquired leases group=g1" in text
    failures = [line for line in text.splitlines() if "handler failed" in line]
    assert len(failures) == 3, text  # max_attempts=3
    assert all(
        line.startswith("ROOT WARNING django_sqlqueue.worker.batch.outcomes handler failed") for line in failures
    )
    assert "id=doomed attempt=1/3" in failures[0] and "giving up (dead letter)" in failures[2]
    assert text.count("Traceback (most recent call last)") == 3
    assert "ScriptedFailure: scripted failure of doomed in g1" in text
    assert "ROOT WARNING django_sqlqueue.worker.batch.outcomes dead-lettered" in text
    assert "ROOT INFO django_sqlqueue.worker.loop worker stopped subscriber=rootlog" in text
    assert "DEBUG" not in text  # the project's level (INFO) holds without -v
    # Nothing was added on stderr: the project's handler is the only one.
    assert "django_sqlqueue" not in process.log()
    assert Handled.objects.filter(message_id="doomed").count() == 3


@pytest.mark.slow
def test_v2_shows_debug_lines_for_polls_batches_and_leases(runconsumer, tmp_path):
    logfile = tmp_path / "root.log"
    publish_many(TOPIC, [{"payload": {"i": i}, "key": f"p{i % 2}"} for i in range(6)])
    process = runconsumer(
        "debug",
        "--group",
        "g1",
        "--topic",
        TOPIC,
        settings="tests.support.process_settings_rootlog",
        verbosity="2",
        env={"SQLQUEUE_TEST_LOGFILE": str(logfile)},
    )
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="g1 caught up")
    wait_until(lambda: "renewed leases" in process.log(), timeout=10, what="a renewal")
    assert process.terminate() == 0

    err = process.log()  # -v 2 added a stderr handler (the root only has a file)
    assert "DEBUG django_sqlqueue.worker.poller poll group=g1 topic=proc.events" in err
    p1 = partition_for("p1", PARTITIONS)
    assert (
        f"DEBUG django_sqlqueue.worker.poller batch group=g1 topic=proc.events partition={p1} size=3 offsets=1-3" in err
    )
    assert (
        "DEBUG django_sqlqueue.worker.threads.leasing renewed leases group=g1 topic=proc.events subscriber=debug" in err
    )
    assert "INFO django_sqlqueue.worker.threads.leasing acquired leases group=g1" in err
    # The records still reach the project's root handler.
    assert "ROOT DEBUG django_sqlqueue.worker.poller batch group=g1" in Path(logfile).read_text()
