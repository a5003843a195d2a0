"""Recurring tasks and messages: cron schedules declared in settings or in code.

In settings::

    SQLQUEUE = {
        "SCHEDULES": {
            "nightly-report": {"cron": "0 3 * * *", "task": "reports.tasks.nightly", "kwargs": {"full": True}},
            "ping": {"cron": "*/5 * * * *", "topic": "monitoring.ping", "payload": {"from": "scheduler"}},
        }
    }

In code (a ``tasks`` or ``consumers`` module of an installed app, which ``runconsumer``
imports)::

    @recurring("0 3 * * *")            # name defaults to the task's module path
    @task()
    def nightly(): ...

    schedule_message("ping", "*/5 * * * *", topic="monitoring.ping", payload={})

Keys of a schedule: ``cron`` (5 fields, or 6 with seconds last; parsed by ``croniter``),
either ``task`` (dotted path of a ``django.tasks`` task; ``args``, ``kwargs``) or ``topic``
(``payload``, ``key``), and optionally ``timezone`` (IANA name, default UTC) and
``catch_up`` (seconds, default 300: how late a missed tick may still fire).

Firing is done by ``scheduler.py`` inside every ``runconsumer`` worker; each tick fires
exactly once (see there).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .exceptions import ConfigurationError, InvalidMessage
from .rules.limits import DEFAULT_DLQ_SUFFIX, MAX_SECONDS
from .rules.validation import encode_json, validate_key, validate_publish_topic, validate_topic

#: Seconds a missed tick may be late and still fire.
DEFAULT_CATCH_UP = 300.0
#: Longest schedule name (its ticks' message ids are "schedule:<name>:<tick>").
MAX_NAME_LENGTH = 80
SCHEDULE_KEYS = frozenset({"cron", "task", "args", "kwargs", "topic", "payload", "key", "timezone", "catch_up"})


@dataclass(frozen=True)
class Schedule:
    """One recurring task or message."""

    name: str
    cron: str
    task: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    topic: str | None = None
    payload: Any = None
    key: str = ""
    timezone: str = "UTC"
    catch_up: float = DEFAULT_CATCH_UP

    def ticks(self, after: dt.datetime, until: dt.datetime, limit: int = 10_000) -> list[dt.datetime]:
        """Ticks t with ``after < t <= until`` (UTC, at most ``limit``), in the schedule's time zone."""
        from croniter import croniter

        zone = ZoneInfo(self.timezone)
        it = croniter(self.cron, after.astimezone(zone))
        out: list[dt.datetime] = []
        while len(out) < limit:
            tick = it.get_next(dt.datetime).astimezone(dt.UTC)
            if tick > until:
                break
            out.append(tick)
        return out

    def tick_id(self, tick: dt.datetime) -> str:
        """The deterministic id of a tick's message (or task result)."""
        return f"schedule:{self.name}:{tick.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"


def parse_schedule(name: Any, spec: Any, dlq_suffix: str = DEFAULT_DLQ_SUFFIX) -> Schedule:
    """Validate one schedule; raise ConfigurationError naming the problem. ``dlq_suffix``:
    the project's ``DLQ_SUFFIX`` (a schedule may not publish to a dead-letter topic)."""
    where = f"schedule {name!r}"
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{where}: a schedule name is a non-empty str of at most {MAX_NAME_LENGTH} characters."
        )
    try:
        validate_topic(name, what=f"{where}: name")
    except InvalidMessage as exc:
        raise ConfigurationError(str(exc)) from exc
    if not isinstance(spec, dict):
        raise ConfigurationError(f"{where} must be a dict, not {type(spec).__name__}.")
    unknown = sorted(map(str, set(spec) - SCHEDULE_KEYS))  # str: keys of any type sort
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown key(s): {', '.join(unknown)}; known: {', '.join(sorted(SCHEDULE_KEYS))}."
        )
    cron = spec.get("cron")
    try:
        from croniter import croniter
    except ImportError as exc:
        raise ConfigurationError(
            f"{where}: cron schedules need croniter (pip install 'django-sqlqueue[schedules]')."
        ) from exc
    if not isinstance(cron, str) or not croniter.is_valid(cron):
        raise ConfigurationError(
            f"{where}: 'cron' must be a cron expression (5 fields, or 6 with seconds), got {cron!r}."
        )
    task, topic = spec.get("task"), spec.get("topic")
    if (task is None) == (topic is None):
        raise ConfigurationError(f"{where}: give exactly one of 'task' (a dotted path) and 'topic'.")
    if task is not None and (not isinstance(task, str) or "." not in task):
        raise ConfigurationError(f"{where}: 'task' must be the dotted path of a task, got {task!r}.")
    if topic is not None:
        try:
            validate_publish_topic(topic, dlq_suffix)
        except InvalidMessage as exc:
            raise ConfigurationError(f"{where}: {exc}") from exc
        if "args" in spec or "kwargs" in spec:
            raise ConfigurationError(f"{where}: 'args'/'kwargs' are for a task; a message has 'payload'.")
    elif "payload" in spec or "key" in spec:
        raise ConfigurationError(f"{where}: 'payload'/'key' are for a message; a task has 'args'/'kwargs'.")
    args, kwargs = spec.get("args", ()), spec.get("kwargs", {})
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        raise ConfigurationError(f"{where}: 'args' must be a list and 'kwargs' a dict.")
    zone = spec.get("timezone", "UTC")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ConfigurationError(f"{where}: unknown time zone {zone!r}.") from exc
    catch_up = spec.get("catch_up", DEFAULT_CATCH_UP)
    if not isinstance(catch_up, (int, float)) or isinstance(catch_up, bool) or not 1 <= catch_up <= MAX_SECONDS:
        raise ConfigurationError(f"{where}: 'catch_up' must be a number of seconds >= 1, got {catch_up!r}.")
    try:
        key = validate_key(spec.get("key", ""))
        encode_json(spec.get("payload"), "'payload'")  # published as JSON: refused now, not at every tick
        encode_json([list(args), kwargs], "'args'/'kwargs'")
    except InvalidMessage as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc
    return Schedule(
        name=name,
        cron=cron,
        task=task,
        args=tuple(args),
        kwargs=dict(kwargs),
        topic=topic,
        payload=spec.get("payload"),
        key=key,
        timezone=zone,
        catch_up=float(catch_up),
    )


def parse_schedules(raw: Any, dlq_suffix: str = DEFAULT_DLQ_SUFFIX) -> list[Schedule]:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"SQLQUEUE['SCHEDULES'] must be a dict of name -> schedule, not {type(raw).__name__}.")
    return [parse_schedule(name, spec, dlq_suffix) for name, spec in raw.items()]


# -- declared in code ----------------------------------------------------------------------

_registry: dict[str, Schedule] = {}
_lock = threading.Lock()


def _register(schedule: Schedule) -> None:
    with _lock:
        existing = _registry.get(schedule.name)
        if existing is not None and existing != schedule:
            raise ConfigurationError(f"schedule {schedule.name!r} is declared twice, differently.")
        _registry[schedule.name] = schedule


def recurring(
    cron: str,
    *,
    name: str | None = None,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    timezone: str = "UTC",
    catch_up: float = DEFAULT_CATCH_UP,
) -> Callable[[Any], Any]:
    """Run the decorated ``django.tasks`` task on ``cron`` (put it above ``@task()``)."""

    def decorator(task: Any) -> Any:
        path = getattr(task, "module_path", None)
        if path is None:
            raise ConfigurationError(f"@recurring decorates a django.tasks Task (put it above @task()), not {task!r}.")
        spec = {
            "cron": cron,
            "task": path,
            "args": list(args),
            "kwargs": kwargs or {},
            "timezone": timezone,
            "catch_up": catch_up,
        }
        _register(parse_schedule(name or path.replace(":", "."), spec))
        return task

    return decorator


def schedule_message(
    name: str,
    cron: str,
    *,
    topic: str,
    payload: Any,
    key: Any = "",
    timezone: str = "UTC",
    catch_up: float = DEFAULT_CATCH_UP,
) -> Schedule:
    """Publish ``payload`` to ``topic`` on ``cron``."""
    schedule = parse_schedule(
        name, {"cron": cron, "topic": topic, "payload": payload, "key": key, "timezone": timezone, "catch_up": catch_up}
    )
    _register(schedule)
    return schedule


def unregister(name: str) -> None:
    with _lock:
        _registry.pop(name, None)


def all_schedules(
    settings_schedules: dict[str, dict[str, Any]], dlq_suffix: str = DEFAULT_DLQ_SUFFIX
) -> list[Schedule]:
    """Return the schedules of ``settings_schedules`` (``SQLQUEUE["SCHEDULES"]``) and those
    declared in code, by name."""
    configured = parse_schedules(settings_schedules, dlq_suffix)
    with _lock:
        declared = dict(_registry)
    names = {s.name for s in configured}
    clash = sorted(names & set(declared))
    if clash:
        raise ConfigurationError(
            f"schedule(s) {', '.join(clash)} are declared both in SQLQUEUE['SCHEDULES'] and in code."
        )
    return sorted([*configured, *declared.values()], key=lambda s: s.name)
