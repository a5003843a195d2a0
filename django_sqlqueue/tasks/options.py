"""``TASKS[alias]["OPTIONS"]`` and ``QUEUES`` of the backend: parsed, and their mistakes listed.

:func:`parse_options` turns ``OPTIONS`` into a :class:`BackendOptions` or raises
``ConfigurationError`` naming the first problem. :func:`configuration_problems` lists
*every* problem of a backend's settings as :class:`Problem` entries, for the backend's
system check (``SQLQueueBackend.check()``, run by ``manage.py check``): an unknown key,
with the nearest known one (a typo such as ``MAX_ATEMPTS``), and the first invalid
value. A backend whose settings have problems is still built -- Django builds task
backends lazily, when a ``@task`` is declared, so raising then would turn a typo into
an import traceback -- and refuses to be used with :class:`TaskBackendMisconfigured`,
one line naming the problem.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..consumers import DEFAULT
from ..exceptions import ConfigurationError, InvalidMessage
from ..rules.atomic_modes import validate_atomic
from ..rules.validation import validate_group, validate_topic
from .compat import InvalidTaskBackend
from .marks import DEFAULT_MARK_RUNNING_AFTER
from .priorities import DEFAULT_PRIORITY, level_topics, parse_priorities
from .timeouts import parse_timeout

#: Keys of ``OPTIONS``.
OPTION_KEYS = frozenset(
    {
        "TOPIC_PREFIX",
        "GROUP",
        "MAX_ATTEMPTS",
        "VISIBILITY_TIMEOUT",
        "TIMEOUT",
        "ATOMIC",
        "BATCH_SIZE",
        "STRICT",
        "PRIORITIES",
        "RESULT_RETENTION",
        "MARK_RUNNING_AFTER",
    }
)
#: Days finished results are kept by ``manage.py queue_prune_task_results`` by default.
DEFAULT_RESULT_RETENTION = 7 * 24 * 3600.0

#: Check ids (``SQLQueueBackend.check()``; E003 is ``app_missing.py``'s, E004 ``checks.py``'s).
UNKNOWN_OPTION = "sqlqueue.tasks.E001"
INVALID_SETTING = "sqlqueue.tasks.E002"


class TaskBackendMisconfigured(ConfigurationError, InvalidTaskBackend):
    """A backend whose ``TASKS`` settings have a problem was used (``manage.py check`` lists them).

    Both a ``ConfigurationError`` and the tasks framework's ``InvalidTaskBackend``.
    """


class Problem(NamedTuple):
    """One mistake in a backend's settings: a check id, the message, and a hint (or None)."""

    id: str
    msg: str
    hint: str | None = None


@dataclass(frozen=True)
class BackendOptions:
    topic_prefix: str
    group: str
    max_attempts: int | None
    visibility_timeout: float | None
    batch_size: int | None
    result_retention: float
    #: ``OPTIONS["TIMEOUT"]``: seconds, None (no limit), a dict of those by queue name, or
    #: DEFAULT (the visibility timeout); see ``tasks/timeouts.py``.
    timeout: Any = DEFAULT
    #: ``OPTIONS["ATOMIC"]``: True, False, "batch", or a dict of those by queue name: a
    #: task's effects and its result row commit with its ack (``atomic.py``).
    atomic: Any = False
    #: ``OPTIONS["MARK_RUNNING_AFTER"]``: seconds a first attempt runs before its result row
    #: is written RUNNING (``tasks/marks.py``); 0: written as the task starts.
    mark_running_after: float = DEFAULT_MARK_RUNNING_AFTER
    #: ``OPTIONS["PRIORITIES"]``: the priority levels, highest first (``tasks/priorities.py``).
    priorities: tuple[int, ...] = (DEFAULT_PRIORITY,)

    def atomic_for_queue(self, queue_name: str) -> bool | str:
        """The consumer ``atomic`` option of one queue."""
        if isinstance(self.atomic, dict):
            return self.atomic.get(queue_name, False)
        return self.atomic

    def timeout_for_queue(self, queue_name: str) -> Any:
        """The consumer ``timeout`` of one queue (a number, None, or DEFAULT)."""
        if isinstance(self.timeout, dict):
            return self.timeout.get(queue_name, DEFAULT)
        return self.timeout


def unknown_options(alias: str, options: Collection[Any]) -> list[Problem]:
    """A problem per key of ``options`` that is not an option, with the nearest known key."""
    where = f"TASKS[{alias!r}]['OPTIONS']"
    problems = []
    for key in sorted(set(options) - OPTION_KEYS, key=str):
        near = difflib.get_close_matches(str(key).upper(), OPTION_KEYS, n=1, cutoff=0.6)
        guess = f"Did you mean {near[0]!r}? " if near else ""
        problems.append(
            Problem(
                UNKNOWN_OPTION,
                f"{where} has an unknown key {key!r}.",
                f"{guess}Valid keys: {', '.join(sorted(OPTION_KEYS))}.",
            )
        )
    return problems


def parse_options(alias: str, options: Any) -> BackendOptions:
    """Validate ``TASKS[alias]["OPTIONS"]``; raise ConfigurationError naming the problem."""
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if not isinstance(options, dict):
        raise ConfigurationError(f"{where} must be a dict, not {type(options).__name__}.")
    unknown = unknown_options(alias, options)
    if unknown:
        raise ConfigurationError(f"{unknown[0].msg} {unknown[0].hint}")
    prefix = options.get("TOPIC_PREFIX", "tasks." if alias == "default" else f"tasks.{alias}.")
    group = options.get("GROUP", "tasks")
    try:
        validate_topic(f"{prefix}x", what=f"{where}['TOPIC_PREFIX'] + queue name")
        validate_group(group)
    except InvalidMessage as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc

    def positive(key: str, kind: type) -> Any:
        value = options.get(key)
        if value is None:
            return None
        ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
        if not ok or isinstance(value, bool) or value <= 0:
            raise ConfigurationError(f"{where}[{key!r}] must be a positive {kind.__name__}, got {value!r}.")
        return kind(value)

    strict = options.get("STRICT", False)
    if not isinstance(strict, bool):
        raise ConfigurationError(f"{where}['STRICT'] must be True or False, got {strict!r}.")
    batch_size = positive("BATCH_SIZE", int)
    if strict:
        if batch_size not in (None, 1):
            raise ConfigurationError(f"{where}: STRICT means one task of a key at a time (BATCH_SIZE 1).")
        batch_size = 1
    retention = positive("RESULT_RETENTION", float)
    mark_after = options.get("MARK_RUNNING_AFTER", DEFAULT_MARK_RUNNING_AFTER)
    if not isinstance(mark_after, (int, float)) or isinstance(mark_after, bool) or not 0 <= mark_after < float("inf"):
        raise ConfigurationError(f"{where}['MARK_RUNNING_AFTER'] must be a number of seconds >= 0, got {mark_after!r}.")
    return BackendOptions(
        topic_prefix=prefix,
        group=group,
        max_attempts=positive("MAX_ATTEMPTS", int),
        visibility_timeout=positive("VISIBILITY_TIMEOUT", float),
        batch_size=batch_size,
        result_retention=DEFAULT_RESULT_RETENTION if retention is None else retention,
        timeout=parse_timeout(f"{where}['TIMEOUT']", options["TIMEOUT"]) if "TIMEOUT" in options else DEFAULT,
        atomic=_parse_atomic(f"{where}['ATOMIC']", options.get("ATOMIC", False)),
        mark_running_after=float(mark_after),
        priorities=parse_priorities(f"{where}['PRIORITIES']", options.get("PRIORITIES")),
    )


def _parse_atomic(where: str, value: Any) -> Any:
    """Validate ``OPTIONS["ATOMIC"]``: True, False, "batch", or a dict of those by queue name."""
    if isinstance(value, dict):
        return {queue: validate_atomic(atomic, f"{where}[{queue!r}]") for queue, atomic in value.items()}
    return validate_atomic(value, where)


def check_queue_options(alias: str, opts: BackendOptions, queues: Collection[str]) -> None:
    """Raise ConfigurationError when ``QUEUES`` is empty or a per-queue option names another queue."""
    if not queues:
        raise ConfigurationError(f"TASKS[{alias!r}]['QUEUES'] must name at least one queue.")
    for key, value in (("TIMEOUT", opts.timeout), ("ATOMIC", opts.atomic)):
        unknown = sorted(set(value) - set(queues)) if isinstance(value, dict) else []
        if unknown:
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS'][{key!r}] names queue(s) not in QUEUES: {', '.join(map(str, unknown))}."
            )
    # A level's topic (tasks.<queue>.p<level>) must not be another queue's topic.
    owner: dict[str, str] = {}
    for queue in sorted(queues):
        for topic in level_topics(f"{opts.topic_prefix}{queue}", opts.priorities):
            if owner.setdefault(topic, queue) != queue:
                raise ConfigurationError(
                    f"TASKS[{alias!r}]: queues {owner[topic]!r} and {queue!r} would share topic {topic!r} (a "
                    "priority level's topic is the queue's topic + '.p<level>'): rename a queue or change "
                    "OPTIONS['PRIORITIES']."
                )


def configuration_problems(alias: str, options: Any) -> list[Problem]:
    """Every unknown key of ``options``; then the first invalid value among the known ones."""
    if not isinstance(options, dict):
        return [Problem(INVALID_SETTING, f"TASKS[{alias!r}]['OPTIONS'] must be a dict, not {type(options).__name__}.")]
    problems = unknown_options(alias, options)
    try:
        parse_options(alias, {k: v for k, v in options.items() if k in OPTION_KEYS})
    except ConfigurationError as exc:
        problems.append(Problem(INVALID_SETTING, str(exc)))
    return problems
