"""What the backend runs: the only way a message's task path becomes a ``Task``.

Anyone who can write to a task topic -- ``publish()``, a Spark backfill, a row inserted
by hand -- writes the path the worker will look up, so the path is checked before it
is used (issue 28, item 1). A path is a task of backend ``alias`` on queue ``queue``
when, in this order:

1. it is a dotted path of Python identifiers, at most :data:`MAX_PATH_LENGTH` long;
2. ``queue`` is one of the backend's ``QUEUES``;
3. its module is found **without running code the project does not ship**: a module
   already imported (``sys.modules``) is used as it is; any other module is imported
   only when it belongs to an installed app (``<AppConfig.name>`` or a module under
   it). Nothing else is imported, so a message cannot make a module's top-level code run;
4. the module's own namespace (``vars(module)``: no module ``__getattr__``, which could
   import more) holds, under the path's last name, a ``django.tasks`` ``Task``
5. whose ``module_path`` is the path, and whose ``backend`` is ``alias`` -- a task
   declared for another backend does not run here, whatever the message says.

The task's *declared* queue need not be ``queue``: ``enqueue()`` accepts
``task.using(queue_name=...)`` for any queue of the backend, so any of them is allowed.
Its arguments are not checked beyond their JSON shape (a list and an object): whoever
can write to a task topic can run the backend's tasks with arguments of their choice.

A message the rule refuses raises :class:`UntrustedTask`, a ``Reject``: the worker
dead-letters it at once (no retry) with the reason, never runs it, and records its
result row FAILED with that error (``execution.py``). ``get_result()`` of such a task
raises it too: a ``TaskResult`` needs the ``Task``, which is not looked up.

**Remembered answers.** Every task message asks the rule, so a ``Task`` it returned is
kept per (alias, path, queue, queues) and given again while the module's namespace still
holds the same object under that name (re-checked each time: no statement, a dict
look-up) -- the other steps depend only on those inputs. A module being imported (its
spec ``_initializing``) goes the whole way. Refusals are not kept (a hostile path costs
what it cost), and the answers are dropped when ``TASKS``, ``SQLQUEUE`` or
``INSTALLED_APPS`` change (``setting_changed``: tests), or past :data:`MAX_REMEMBERED`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Collection, Mapping
from typing import Any

from django.apps import apps
from django.core.signals import setting_changed

from ..exceptions import Reject
from .compat import Task
from .priorities import DEFAULT_PRIORITY, split_level

#: Longest task path (the ``task_path`` column of ``queue_task_results``).
MAX_PATH_LENGTH = 255
#: Answers of :func:`trusted_task` kept at most (then all are dropped and found again).
MAX_REMEMBERED = 1024

#: (alias, path, queue name, queues) -> (the object the module held, the ``Task`` returned).
#: Plain dict operations only: safe to share between handler threads (a lost race finds
#: the same answer twice).
_remembered: dict[tuple[str, str, str, frozenset[str]], tuple[Any, Task]] = {}


def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting in ("TASKS", "SQLQUEUE", "INSTALLED_APPS"):
        _remembered.clear()


setting_changed.connect(_forget, dispatch_uid="django_sqlqueue.tasks.trust")


class UntrustedTask(Reject):
    """A message names a task this backend does not run (see :mod:`django_sqlqueue.tasks.trust`).

    A ``Reject``: the message is dead-lettered at once, without retries, with this error.
    """


def _refused(path: Any, alias: str, why: str) -> UntrustedTask:
    # repr(): a hostile path's control characters are escaped in the error and the logs.
    shown = repr(path[:MAX_PATH_LENGTH]) if isinstance(path, str) else f"of type {type(path).__name__}"
    return UntrustedTask(f"task path {shown} is not a task of backend {alias!r}: {why}")


def in_installed_app(module_name: str) -> bool:
    """Whether ``module_name`` is an installed app's package or a module under it."""
    return any(
        module_name == config.name or module_name.startswith(f"{config.name}.") for config in apps.get_app_configs()
    )


def _module(path: str, alias: str) -> Any:
    """The module of ``path``: imported already, or imported now if it is an installed app's."""
    module_name = path.rpartition(".")[0]
    module = sys.modules.get(module_name)
    if module is not None:
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            # Another handler thread is importing it right now (its first task arrived on
            # two threads at once): the half-run module may not have declared the task yet.
            # import_module waits on the module's import lock until that import is done.
            return importlib.import_module(module_name)
        return module
    if not in_installed_app(module_name):
        raise _refused(
            path,
            alias,
            f"its module {module_name!r} is not part of an installed app and was not imported, "
            "so it is not imported (declare tasks in an installed app)",
        )
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # any import failure is a refusal, with its reason
        raise _refused(
            path, alias, f"its module {module_name!r} cannot be imported: {type(exc).__name__}: {exc}"
        ) from exc


def trusted_task(path: Any, *, alias: str, queues: Collection[str], queue_name: str) -> Task:
    """Return the ``Task`` at ``path`` on ``queue_name`` if backend ``alias`` runs it (see the
    module docstring); raise :class:`UntrustedTask` saying why not."""
    if not isinstance(path, str):
        raise _refused(path, alias, f"a task path is a string, not a {type(path).__name__}")
    key = (alias, path, queue_name, frozenset(queues))
    known = _remembered.get(key)
    if known is not None:
        module_name, _, name = path.rpartition(".")
        module = sys.modules.get(module_name)
        # The same object under the same name of a module done importing: the same answer.
        if (
            module is not None
            and not getattr(getattr(module, "__spec__", None), "_initializing", False)
            and getattr(module, "__dict__", {}).get(name) is known[0]
        ):
            return known[1]
    found, task = _trusted_task(path, alias=alias, queues=queues, queue_name=queue_name)
    if len(_remembered) >= MAX_REMEMBERED:
        _remembered.clear()
    _remembered[key] = (found, task)
    return task


def _trusted_task(path: str, *, alias: str, queues: Collection[str], queue_name: str) -> tuple[Task, Task]:
    """The rule itself: (the ``Task`` the module holds at ``path``, the one to run)."""
    parts = path.split(".")
    if len(path) > MAX_PATH_LENGTH or len(parts) < 2 or not all(map(str.isidentifier, parts)):
        raise _refused(path, alias, f"not a dotted path of Python names of at most {MAX_PATH_LENGTH} characters")
    if queue_name not in queues:
        raise _refused(path, alias, f"queue {queue_name!r} is not one of its QUEUES ({', '.join(sorted(queues))})")
    module = _module(path, alias)
    obj = getattr(module, "__dict__", {}).get(parts[-1])
    if not isinstance(obj, Task):
        found = "nothing" if obj is None else f"a {type(obj).__name__}"
        raise _refused(path, alias, f"it is {found}, not a django.tasks Task")
    if obj.module_path != path:
        raise _refused(path, alias, f"it is the task {obj.module_path!r}, declared elsewhere")
    if obj.backend != alias:
        raise _refused(path, alias, f"it is declared for backend {obj.backend!r}")
    if obj.queue_name == queue_name:
        return obj, obj
    try:
        return obj, obj.using(queue_name=queue_name)
    except Exception as exc:  # the backend's validate_task: what enqueue() would refuse too
        raise _refused(path, alias, f"not on queue {queue_name!r}: {type(exc).__name__}: {exc}") from exc


def queue_of_topic(topics: Mapping[str, str], topic: str) -> str | None:
    """The queue whose topic, or one of whose priority levels' topics, is ``topic``
    (``topics``: queue name -> topic; ``priorities.py``), or None."""
    # Loops, not generators: asked for every task message.
    for name, queue_topic in topics.items():
        if queue_topic == topic:
            return name
    base, level = split_level(topic)
    if level != DEFAULT_PRIORITY:
        for name, queue_topic in topics.items():
            if queue_topic == base:
                return name
    return None


def message_task(alias: str, topics: Mapping[str, str], topic: str, payload: Any) -> Task:
    """Return the ``Task`` a message of ``topic`` names, on the topic's queue, if backend
    ``alias`` runs it; raise :class:`UntrustedTask` saying why not.

    Besides :func:`trusted_task`'s rule, the message must be one ``enqueue()`` could have
    written: a JSON object whose ``queue_name`` and ``backend`` (when present) are the
    topic's queue and ``alias``, with ``args`` a list and ``kwargs`` an object.
    """
    if not isinstance(payload, dict):
        raise UntrustedTask(
            f"a message of {topic!r} is not a task of backend {alias!r}: its payload is a "
            f"{type(payload).__name__}, not an object with 'task'"
        )
    if "task" not in payload:
        raise UntrustedTask(f"a message of {topic!r} is not a task of backend {alias!r}: its payload has no 'task'")
    path = payload["task"]
    queue = queue_of_topic(topics, topic)
    if queue is None:
        raise _refused(path, alias, f"topic {topic!r} is not one of its task topics")
    claimed = payload.get("queue_name", queue)
    if claimed != queue:
        raise _refused(path, alias, f"the message's queue_name {claimed!r} is not its topic's queue {queue!r}")
    if payload.get("backend", alias) != alias:
        raise _refused(path, alias, f"the message names backend {payload['backend']!r}")
    if not isinstance(payload.get("args", []), list) or not isinstance(payload.get("kwargs", {}), dict):
        raise _refused(path, alias, "its 'args' must be a list and its 'kwargs' an object")
    return at_level(trusted_task(path, alias=alias, queues=topics.keys(), queue_name=queue), topics, topic)


def at_level(task: Task, topics: Mapping[str, str], topic: str) -> Task:
    """``task`` with the priority of the level whose topic is ``topic`` (``priorities.py``):
    a task enqueued with ``.using(priority=...)`` has its topic's level, not its declared one."""
    level = DEFAULT_PRIORITY if topic in topics.values() else split_level(topic)[1]
    return task if task.priority == level else task.using(priority=level)
