"""Rate and concurrency limits of tasks (django_sqlqueue/tasks/limits.py): the decorators, the
limits of one run, and tasks that wait -- not attempts -- run by a real in-process worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_sqlqueue import ConfigurationError
from django_sqlqueue.models import DeliveryState
from django_sqlqueue.tasks import concurrency_limit, rate_limit
from django_sqlqueue.tasks.compat import TaskResultStatus
from django_sqlqueue.tasks.limits import limits_of
from tests.support.task_helpers import finished, first_delivery, running_worker, task_settings, wait_until
from tests.support.taskapp import limit_tasks
from tests.support.taskapp.models import Run


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    with task_settings():
        yield


# -- the decorators --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        ("20", "is not '<count>/<period>'"),
        ("x/s", "is not '<count>/<period>'"),
        ("0/s", "must be above zero"),
        ("20/d", "unknown period 'd'"),
        (20, "is a string like '20/s'"),
    ],
)
def test_bad_rates_are_refused_with_the_problem_named(rate: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        rate_limit(rate)


def test_bad_bursts_keys_and_concurrency_limits_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="burst must be a whole number of at least 1, got 0"):
        rate_limit("5/s", burst=0)
    with pytest.raises(ConfigurationError, match="has no parameter 'customer'"):

        @rate_limit("5/s", key="customer")
        def f(account: str) -> None: ...

    with pytest.raises(ConfigurationError, match="a parameter name or a callable, got 3"):
        concurrency_limit(2, key=3)  # type: ignore[arg-type]
    for bad in (0, True, "2", 1.5):
        with pytest.raises(ConfigurationError, match="concurrency limit is a whole number"):
            concurrency_limit(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="has a rate_limit already"):

        @rate_limit("5/s")
        @rate_limit("10/s")
        def g() -> None: ...


def test_the_limits_of_a_run_apply_its_keys() -> None:
    sync = limit_tasks.sync
    limits = limits_of(sync, ["acme"], {"customer": "c1"})
    assert limits is not None
    ((name, rate),) = limits.rates
    assert name == f"task:rate:{sync.module_path}:c1"
    assert (rate.count, rate.period, rate.burst, rate.interval) == (5, 60.0, 2, 12.0)
    assert limits.concurrency == (f"task:concurrency:{sync.module_path}:acme-c1", 2)
    # Arguments that do not fit the signature: no limits (the task fails on its arguments).
    assert limits_of(sync, [], {"nope": 1}) is None
    assert limits_of(limit_tasks.unlimited, ["x", "a", 0], {}) is None


def test_on_top_of_task_it_marks_the_tasks_function_and_a_context_task_keys_past_the_context() -> None:
    limits = limits_of(limit_tasks.with_context, ["a"], {})
    assert limits is not None and limits.rates[0][0].endswith("with_context:a")


@pytest.mark.django_db(transaction=True)
def test_the_handler_gives_the_limits_of_the_message() -> None:
    from django_sqlqueue.tasks.execution import handler_for

    handler = handler_for("default", 3)
    limited = handler.limits_for(first_delivery(limit_tasks.one_per_3s.enqueue("l", customer="c9")))
    assert limited is not None and limited.rates[0][0].endswith("one_per_3s:c9")
    assert handler.limits_for(first_delivery(limit_tasks.unlimited.enqueue("u", "a", 0))) is None


# -- waiting tasks, run by a worker ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_task_over_its_rate_waits_without_an_attempt_then_runs_and_other_keys_go_on() -> None:
    waiting = [limit_tasks.one_per_3s.enqueue(f"a{i}", customer="a") for i in range(3)]
    other = limit_tasks.one_per_3s.enqueue("b0", customer="b")
    with running_worker(concurrency=2):
        assert finished(other).status == TaskResultStatus.SUCCESSFUL
        wait_until(lambda: Run.objects.filter(key="a").count() == 1, 10, "one task of customer a to run")
        # The two others were delivered and handed back to wait: not attempts, no result change.
        results = [limit_tasks.one_per_3s.get_result(r.id) for r in waiting]
        waits = [r for r in results if r.status == TaskResultStatus.READY]
        assert len(waits) == 2
        for result in waits:
            assert result.errors == [] and result.worker_ids == []
        # Handed back, not failed: scheduled again with no retry counted. The worker may still
        # hold them for a moment (its handler threads were busy when they were fetched).
        pending = DeliveryState.objects.filter(acked=False)
        wait_until(
            lambda: sorted(pending.values_list("status", "retry_count")) == [(DeliveryState.Status.SCHEDULED, 0)] * 2,
            10,
            "the two waiting tasks to be handed back",
        )
        # They run later, one per 3 s, each on its first attempt.
        done = [finished(r, 20) for r in waits]
    assert all(r.status == TaskResultStatus.SUCCESSFUL and r.attempts == 1 and r.errors == [] for r in done)
    starts = sorted(Run.objects.filter(key="a").values_list("started", flat=True))
    assert len(starts) == 3
    assert starts[1] - starts[0] >= 2.9 and starts[2] - starts[1] >= 2.9


@pytest.mark.django_db(transaction=True)
def test_waiting_tasks_run_later_at_the_rate() -> None:
    results = [limit_tasks.twenty_a_second.enqueue(f"t{i}") for i in range(30)]
    with running_worker(concurrency=2):
        done = [finished(r, 30) for r in results]
    assert all(r.status == TaskResultStatus.SUCCESSFUL and r.attempts == 1 for r in done)
    starts = sorted(Run.objects.values_list("started", flat=True))
    assert len(starts) == 30
    # 30 starts spaced 1/20 s apart (burst 1) take at least 29 intervals.
    assert starts[-1] - starts[0] >= 29 * 0.05 - 0.05


@pytest.mark.django_db(transaction=True)
def test_a_concurrency_limit_holds_its_key_to_n_at_once_and_other_keys_run_beside_it() -> None:
    results = [limit_tasks.two_at_a_time.enqueue(f"x{i}", "x", 0.3) for i in range(6)]
    results += [limit_tasks.two_at_a_time.enqueue(f"y{i}", "y", 0.3) for i in range(2)]
    with running_worker(concurrency=4):
        done = [finished(r, 30) for r in results]
    assert all(r.status == TaskResultStatus.SUCCESSFUL and r.attempts == 1 for r in done)
    runs = list(Run.objects.values_list("key", "started", "finished"))
    x = [(s, f) for k, s, f in runs if k == "x"]
    assert max(sum(1 for s2, f2 in x if s2 <= s < f2) for s, _ in x) <= 2
    assert max(sum(1 for s2, f2 in x if s2 <= s < f2) for s, _ in x) == 2  # the limit is used
    y_first = min(s for k, s, _ in runs if k == "y")
    assert y_first < max(s for s, _ in x), "account y waited for account x"
