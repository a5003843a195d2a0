"""The testing helpers for the ``django.tasks`` backend (``django_sqlqueue.tasks``).

An enqueue is a publish (see ``tasks/backend.py``), so a :func:`capture_published`
block records enqueued tasks too; these helpers look at them as tasks::

    with capture_published() as published:
        send_welcome.enqueue(user_id=7)
        assert_enqueued(send_welcome, kwargs={"user_id": 7})  # the innermost open capture
    assert_enqueued(send_welcome, kwargs={"user_id": 7}, published=published)  # after the block
    drain_tasks()  # runs them through the queue, as runconsumer does

``task`` is a ``django.tasks`` ``Task`` (the ``@task`` function) or its dotted path.
Without ``published=``, the assertions look at the innermost *open* capture (the
``sqlqueue_published`` fixture's and ``SQLQueueTestMixin``'s are open for the whole test)
and raise ``TestingError`` when none is: never at one closed earlier, which may belong to
an earlier test.
This module imports ``django.tasks`` only through the backend, when it is configured.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import TestingError
from .capture import ANY, CapturedMessage, PublishedMessages, current_capture, payload_matches
from .draining import DrainSummary, drain_consumers


def _open_capture(caller: str) -> PublishedMessages:
    return current_capture(caller, after=f"{caller}(..., published=published)")


def _path(task: Any) -> str:
    path = task if isinstance(task, str) else getattr(task, "module_path", None)
    if not isinstance(path, str):
        raise TestingError(f"expected a task (a @task function) or its dotted path, got {task!r}.")
    return path


def enqueued(
    task: Any,
    *,
    args: Any = ANY,
    kwargs: Any = ANY,
    queue_name: str | None = None,
    published: PublishedMessages | None = None,
) -> list[CapturedMessage]:
    """The captured enqueues of ``task`` whose ``args`` (a list, compared exactly) and
    ``kwargs`` (a dict subset, or a predicate) match; from ``published`` or the innermost open capture."""
    path = _path(task)
    found = []
    for m in published if published is not None else _open_capture("enqueued"):
        payload = m.payload if isinstance(m.payload, dict) else {}
        if payload.get("task") != path or "kwargs" not in payload:
            continue
        if queue_name is not None and payload.get("queue_name") != queue_name:
            continue
        if args is not ANY and not payload_matches(
            payload.get("args"), list(args) if isinstance(args, tuple) else args
        ):
            continue
        if kwargs is not ANY and not payload_matches(payload.get("kwargs"), kwargs):
            continue
        found.append(m)
    return found


def assert_enqueued(
    task: Any,
    *,
    args: Any = ANY,
    kwargs: Any = ANY,
    queue_name: str | None = None,
    count: int | None = None,
    published: PublishedMessages | None = None,
) -> list[CapturedMessage]:
    """Assert that ``task`` was enqueued (exactly ``count`` times if given) with matching arguments.

    The ``AssertionError`` lists the tasks that were enqueued. Needs a capture, like
    :func:`~django_sqlqueue.testing.assert_published`: ``published`` (a capture's
    ``PublishedMessages``) or the innermost open one.
    """
    captured = published if published is not None else _open_capture("assert_enqueued")
    found = enqueued(task, args=args, kwargs=kwargs, queue_name=queue_name, published=captured)
    if (count is None and not found) or (count is not None and len(found) != count):
        wanted = "at least once" if count is None else f"{count} time(s)"
        raise AssertionError(
            f"expected {_path(task)} enqueued {wanted}{_criteria(args, kwargs, queue_name)}, found {len(found)}.\n"
            f"{_listing(captured)}"
        )
    return found


def assert_not_enqueued(
    task: Any,
    *,
    args: Any = ANY,
    kwargs: Any = ANY,
    queue_name: str | None = None,
    published: PublishedMessages | None = None,
) -> None:
    """Assert that ``task`` was not enqueued with matching arguments (in ``published`` or the
    innermost open capture)."""
    captured = published if published is not None else _open_capture("assert_not_enqueued")
    found = enqueued(task, args=args, kwargs=kwargs, queue_name=queue_name, published=captured)
    if found:
        raise AssertionError(
            f"expected {_path(task)} not enqueued{_criteria(args, kwargs, queue_name)}, found {len(found)}.\n"
            f"{_listing(captured)}"
        )


def drain_tasks(
    queue_name: str | None = None, *, backend: str | None = None, max_messages: int | None = None
) -> DrainSummary:
    """Run the enqueued tasks of ``queue_name`` (None: every queue) of the ``backend`` alias
    (None: every backend of ``django_sqlqueue.tasks``) until none is left: :func:`drain` over
    the task queues' consumers, whatever ``settings.TASKS`` said when Django started."""
    from ..tasks.compat import task_backends
    from ..tasks.discovery import configured_aliases, task_consumer_specs

    aliases = configured_aliases()
    if backend is not None and backend not in aliases:
        raise TestingError(f"drain_tasks(): TASKS[{backend!r}] is not a django_sqlqueue.tasks backend.")
    wanted_topics = set()
    for alias in [backend] if backend is not None else aliases:
        found: Any = task_backends[alias]
        topics: dict[str, str] = found.topics()
        if queue_name is not None and queue_name not in topics:
            raise TestingError(f"drain_tasks(): backend {alias!r} has no queue {queue_name!r}.")
        wanted_topics |= {topic for name, topic in topics.items() if queue_name is None or name == queue_name}
    specs = [s for s in task_consumer_specs() if s.topic in wanted_topics]
    if not specs:
        raise TestingError("drain_tasks(): no task queue of django_sqlqueue.tasks is configured in settings.TASKS.")
    return drain_consumers(specs, max_messages=max_messages)


def _criteria(args: Any, kwargs: Any, queue_name: str | None) -> str:
    parts = []
    if args is not ANY:
        parts.append(f"args={list(args) if isinstance(args, tuple) else args!r}")
    if kwargs is not ANY:
        parts.append(f"kwargs containing {kwargs!r}")
    if queue_name is not None:
        parts.append(f"queue_name={queue_name!r}")
    return (" with " + ", ".join(parts)) if parts else ""


def _listing(captured: PublishedMessages) -> str:
    tasks = [m for m in captured if isinstance(m.payload, dict) and "task" in m.payload and "kwargs" in m.payload]
    if not tasks:
        return "No task was enqueued inside the capture."
    lines = [
        f"  {m.payload['task']}(args={m.payload.get('args')!r}, kwargs={m.payload.get('kwargs')!r}) "
        f"queue={m.payload.get('queue_name')!r} id={m.id!r}"
        for m in tasks[:50]
    ]
    return f"Enqueued ({len(tasks)}):\n" + "\n".join(lines)
