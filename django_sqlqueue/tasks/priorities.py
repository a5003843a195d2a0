"""Task priorities: one topic per priority level of a queue, polled highest first.

Django's ``Task.priority`` (-100 to 100, default 0) is honoured for the levels a backend
lists in ``OPTIONS["PRIORITIES"]`` (default ``[0]``). A queue's level-0 tasks stay on its
topic (``tasks.<queue>``); a task of another level goes to that level's topic,
``tasks.<queue>.p<level>`` (``tasks.default.p50``, ``tasks.default.p-10``). A worker
subscribes to every level's topic and, in each round of its poll loop, polls a queue's
levels from the highest down, and polls no lower level of that queue once a higher one
delivered something (``worker/bands.py``). So among the ready tasks of a queue a higher
priority starts first, and equal priorities keep their order (the level's topic is a
topic like any other: per-key order within it, as before).

Why topics and not a priority-ordered fetch: the log is append-only and a partition is
delivered from a cursor (the highest offset delivered, ``docs/design.md``, "The fetch
never stalls..."); taking a high-priority message from the middle of a partition would
need a per-priority cursor and an index on every message of every topic. A topic per
level costs nothing to a queue without priorities, and to one with ``k`` levels ``k``
subscriptions (their leases and idle polls). A priority not listed is refused by
``validate_task`` (``InvalidTask`` naming the option) rather than silently rounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..exceptions import ConfigurationError

#: Django's bounds and default (``django.tasks.base``); repeated here so that reading the
#: settings does not import django.tasks.
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = -100, 100, 0

_BAND = re.compile(r"^(?P<base>.+)\.p(?P<level>-?\d{1,3})$")


def parse_priorities(where: str, value: Any) -> tuple[int, ...]:
    """Validate ``OPTIONS["PRIORITIES"]``: the levels, highest first (0 is always one)."""
    if value is None:
        return (DEFAULT_PRIORITY,)
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise ConfigurationError(f"{where} must be a list of integers, got {type(value).__name__}.")
    levels = set()
    for level in value:
        if not isinstance(level, int) or isinstance(level, bool) or not MIN_PRIORITY <= level <= MAX_PRIORITY:
            raise ConfigurationError(
                f"{where} must hold integers from {MIN_PRIORITY} to {MAX_PRIORITY} (Django's Task.priority), "
                f"got {level!r}."
            )
        levels.add(level)
    levels.add(DEFAULT_PRIORITY)
    return tuple(sorted(levels, reverse=True))


def level_topic(base: str, level: int) -> str:
    """The topic of priority ``level`` of the queue whose topic is ``base``."""
    return base if level == DEFAULT_PRIORITY else f"{base}.p{level}"


def level_topics(base: str, levels: Iterable[int]) -> dict[str, int]:
    """Topic -> level, for every level of the queue whose topic is ``base``."""
    return {level_topic(base, level): level for level in levels}


def split_level(topic: str) -> tuple[str, int]:
    """(base topic, level) of a level's topic; ``(topic, 0)`` for a topic without one."""
    match = _BAND.match(topic)
    if match is None:
        return topic, DEFAULT_PRIORITY
    return match["base"], int(match["level"])


def refusal(alias: str, priority: int, levels: Iterable[int]) -> str:
    """The ``InvalidTask`` message for a priority the backend has no level for."""
    listed = ", ".join(str(level) for level in sorted(levels))
    return (
        f"priority {priority} is not one of backend {alias!r}'s priority levels ({listed}): add it to "
        f"TASKS[{alias!r}]['OPTIONS']['PRIORITIES'] (each level is a topic the workers poll, highest first)."
    )
