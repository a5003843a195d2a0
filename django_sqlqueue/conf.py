"""The ``SQLQUEUE`` settings dict, validated once and frozen.

Every key is optional; defaults are the ``DEFAULT_*`` constants below. Durations are
in seconds (int or float). :func:`get_settings` builds a frozen :class:`QueueSettings`
lazily and the cache is cleared on Django's ``setting_changed`` signal, so
``override_settings(SQLQUEUE=...)`` works in tests. :func:`validate` returns the list of
problems; it feeds the system checks (``sqlqueue.E001``...) and raises
:class:`~django_sqlqueue.exceptions.ConfigurationError` when a worker or ``publish()``
reads an invalid configuration.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import ConfigurationError
from .rules import dlq
from .rules.limits import DEFAULT_DLQ_SUFFIX, MAX_DLQ_SUFFIX_LENGTH, MAX_SECONDS, MAX_TOPIC_LENGTH, TOPIC_RE

#: Seconds a worker sleeps between polls while its partitions have work.
DEFAULT_POLL_INTERVAL = 0.1
#: Messages fetched per partition per poll (1 = strict serialization).
DEFAULT_BATCH_SIZE = 10
#: Seconds a delivered message stays invisible before it is redelivered.
DEFAULT_VISIBILITY_TIMEOUT = 30.0
#: Deliveries of one message before it moves to the dead-letter topic.
DEFAULT_MAX_ATTEMPTS = 5
#: Seconds a partition lease stays valid without renewal.
DEFAULT_LEASE_DURATION = 30.0
#: Seconds between lease renewals (must be well below ``LEASE_DURATION``).
DEFAULT_LEASE_RENEW_INTERVAL = 10.0
#: Appended to a topic to name its dead-letter topic.
#: Largest accepted payload, measured as UTF-8 encoded JSON (256 KiB, as SQS).
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
#: Database alias the queue tables live in.
DEFAULT_DATABASE = "default"
#: Ceiling of the idle poll interval: polling slows from POLL_INTERVAL towards it.
DEFAULT_POLL_INTERVAL_MAX = 1.0
#: Bounds of the retry delay after a failed handler: BACKOFF_MIN * 2**(attempt-1),
#: with +/-20% jitter, capped at BACKOFF_MAX.
DEFAULT_BACKOFF_MIN = 1.0
DEFAULT_BACKOFF_MAX = 300.0
#: Seconds to keep fully acked messages before garbage collection (Vitess
#: ``vt_purge_after``); 0 deletes them as soon as every group has acked them.
DEFAULT_RETENTION = 0.0
#: Seconds the per-hour message counters (``queue_topic_hours``, the report's "messages per
#: hour") are kept after their hour; garbage collection deletes older ones.
DEFAULT_STATS_RETENTION = 30 * 24 * 3600.0
#: Seconds the console's per-minute history (``queue_history``: published, handled, failed,
#: retried, dead-lettered and lag per group and topic) is kept; 0 turns the history off.
DEFAULT_HISTORY_RETENTION = 7 * 24 * 3600.0
#: Seconds between garbage-collection passes of a worker.
DEFAULT_GC_INTERVAL = 60.0
#: Partitions of a topic not listed in ``TOPICS``. Keys are hashed to them.
DEFAULT_PARTITIONS = 8
#: Most partitions a hashed topic may have.
MAX_PARTITIONS = 4096
#: A METRICS_TOKEN (check E012): at least 16 printable ASCII characters, no space.
_METRICS_TOKEN_RE = re.compile(r"[\x21-\x7e]{16,}")
#: Keys a ``TOPICS`` entry may have.
TOPIC_OPTION_KEYS = frozenset({"partitions", "per_key"})
#: Keys of ``HEALTH`` and the kind of value each takes.
HEALTH_KEYS = {
    "MAX_LAG": "an integer >= 0",
    "MAX_LAG_SECONDS": "a number of seconds >= 0",
    "MAX_DEAD_LETTERS": "an integer >= 0",
    "REQUIRE_SUBSCRIBERS": "True or False",
}
#: Seconds between the "database still unreachable" lines a worker logs during an outage.
DEFAULT_OUTAGE_REPORT_INTERVAL = 30.0


@dataclass(frozen=True)
class QueueSettings:
    """The validated, typed view of ``settings.SQLQUEUE``."""

    POLL_INTERVAL: float = DEFAULT_POLL_INTERVAL
    BATCH_SIZE: int = DEFAULT_BATCH_SIZE
    VISIBILITY_TIMEOUT: float = DEFAULT_VISIBILITY_TIMEOUT
    MAX_ATTEMPTS: int = DEFAULT_MAX_ATTEMPTS
    LEASE_DURATION: float = DEFAULT_LEASE_DURATION
    LEASE_RENEW_INTERVAL: float = DEFAULT_LEASE_RENEW_INTERVAL
    DLQ_SUFFIX: str = DEFAULT_DLQ_SUFFIX
    MAX_PAYLOAD_BYTES: int = DEFAULT_MAX_PAYLOAD_BYTES
    DATABASE: str = DEFAULT_DATABASE
    POLL_INTERVAL_MAX: float = DEFAULT_POLL_INTERVAL_MAX
    BACKOFF_MIN: float = DEFAULT_BACKOFF_MIN
    BACKOFF_MAX: float = DEFAULT_BACKOFF_MAX
    RETENTION: float = DEFAULT_RETENTION
    GC_INTERVAL: float = DEFAULT_GC_INTERVAL
    STATS_RETENTION: float = DEFAULT_STATS_RETENTION
    HISTORY_RETENTION: float = DEFAULT_HISTORY_RETENTION
    PARTITIONS: int = DEFAULT_PARTITIONS
    OUTAGE_REPORT_INTERVAL: float = DEFAULT_OUTAGE_REPORT_INTERVAL
    #: PostgreSQL: publishes NOTIFY their topic's channel and each worker LISTENs on one
    #: extra connection, so a new message wakes it at once (django_sqlqueue.worker.threads.listener).
    #: Ignored on MySQL/MariaDB and SQLite, which have no notifications.
    NOTIFY: bool = True
    #: Bearer token of the Prometheus view (``django_sqlqueue.metrics.views.metrics``); None: staff only.
    METRICS_TOKEN: str | None = None
    #: Health thresholds of ``queue_health`` and the console's overview (django_sqlqueue.ops.health):
    #: ``{"MAX_LAG": 1000, "MAX_LAG_SECONDS": 300, "MAX_DEAD_LETTERS": 0, "REQUIRE_SUBSCRIBERS": True}``.
    HEALTH: dict[str, Any] = field(default_factory=dict)
    #: Per-topic options: ``{"orders": {"partitions": 16}, "tenants": {"per_key": True}}``.
    TOPICS: dict[str, dict[str, Any]] = field(default_factory=dict)

    #: Recurring tasks and messages by name (django_sqlqueue.schedules).
    SCHEDULES: dict[str, dict[str, Any]] = field(default_factory=dict)

    def dlq_topic(self, topic: str) -> str:
        """Return the dead-letter topic of ``topic`` under these settings (``<topic><DLQ_SUFFIX>``)."""
        return dlq.dlq_topic(topic, self.DLQ_SUFFIX)

    def is_dlq_topic(self, topic: str) -> bool:
        """Whether ``topic`` is a dead-letter topic under these settings."""
        return dlq.is_dlq_topic(topic, self.DLQ_SUFFIX)

    def partitions_for(self, topic: str) -> int | None:
        """Return ``topic``'s partition count, or None for a topic with one partition per key.

        A dead-letter topic (``<topic><DLQ_SUFFIX>``) not listed in ``TOPICS`` has the
        default count.
        """
        options = self.TOPICS.get(topic)
        if options is None:
            return self.PARTITIONS
        if options.get("per_key"):
            return None
        return int(options.get("partitions", self.PARTITIONS))


KNOWN_KEYS = frozenset(f.name for f in fields(QueueSettings))
_DURATIONS = (
    "POLL_INTERVAL",
    "POLL_INTERVAL_MAX",
    "VISIBILITY_TIMEOUT",
    "LEASE_DURATION",
    "LEASE_RENEW_INTERVAL",
    "BACKOFF_MIN",
    "BACKOFF_MAX",
    "GC_INTERVAL",
    "OUTAGE_REPORT_INTERVAL",
    "STATS_RETENTION",
)
#: Every key whose value is a number of seconds.
DURATION_KEYS = (*_DURATIONS, "RETENTION", "HISTORY_RETENTION")
_POSITIVE_INTS = ("BATCH_SIZE", "MAX_ATTEMPTS", "MAX_PAYLOAD_BYTES", "PARTITIONS")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the configuration, with a stable check id."""

    id: str
    msg: str
    hint: str = ""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_seconds(value: Any, *, zero: bool = False) -> bool:
    """Whether ``value`` is a duration a worker can wait for: finite, positive (or 0), at most 100 years."""
    return _is_number(value) and (value >= 0 if zero else value > 0) and value <= MAX_SECONDS and math.isfinite(value)


def validate(raw: Any) -> list[Problem]:
    """Return every problem found in the raw ``SQLQUEUE`` value (empty when valid)."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [Problem("sqlqueue.E001", f"SQLQUEUE must be a dict, not {type(raw).__name__}.")]
    problems: list[Problem] = []
    unknown = sorted(map(str, set(raw) - KNOWN_KEYS))  # str: keys of any type sort
    if unknown:
        problems.append(
            Problem(
                "sqlqueue.E002",
                f"SQLQUEUE has unknown key(s): {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(KNOWN_KEYS))}.",
            )
        )
    for key in _DURATIONS:
        if key in raw and not _is_seconds(raw[key]):
            problems.append(
                Problem(
                    "sqlqueue.E003",
                    f"SQLQUEUE[{key!r}] must be a positive number of seconds (at most {MAX_SECONDS}, 100 years), "
                    f"got {raw[key]!r}.",
                )
            )
    for key in _POSITIVE_INTS:
        if key in raw and not (isinstance(raw[key], int) and not isinstance(raw[key], bool) and raw[key] > 0):
            problems.append(
                Problem("sqlqueue.E004", f"SQLQUEUE[{key!r}] must be a positive integer, got {raw[key]!r}.")
            )
    if "DLQ_SUFFIX" in raw:
        suffix = raw["DLQ_SUFFIX"]
        if not (isinstance(suffix, str) and 0 < len(suffix) <= MAX_DLQ_SUFFIX_LENGTH and TOPIC_RE.match(suffix)):
            problems.append(
                Problem(
                    "sqlqueue.E005",
                    f"SQLQUEUE['DLQ_SUFFIX'] must be 1-{MAX_DLQ_SUFFIX_LENGTH} characters of "
                    f"[A-Za-z0-9._-], got {suffix!r}.",
                )
            )
    if "DATABASE" in raw:
        alias = raw["DATABASE"]
        if not isinstance(alias, str) or alias not in django_settings.DATABASES:
            problems.append(
                Problem(
                    "sqlqueue.E006",
                    f"SQLQUEUE['DATABASE'] is {alias!r}, which is not a key of settings.DATABASES.",
                )
            )
    for key in ("RETENTION", "HISTORY_RETENTION"):
        if key in raw and not _is_seconds(raw[key], zero=True):
            problems.append(
                Problem(
                    "sqlqueue.E003",
                    f"SQLQUEUE[{key!r}] must be a number of seconds >= 0 (at most {MAX_SECONDS}, 100 years), "
                    f"got {raw[key]!r}.",
                )
            )
    for low_key, high_key in (("POLL_INTERVAL", "POLL_INTERVAL_MAX"), ("BACKOFF_MIN", "BACKOFF_MAX")):
        low = raw.get(low_key, getattr(QueueSettings, low_key))
        high = raw.get(high_key, getattr(QueueSettings, high_key))
        if _is_number(low) and _is_number(high) and low > high:
            problems.append(
                Problem(
                    "sqlqueue.E008", f"SQLQUEUE[{low_key!r}] ({low}) must not exceed SQLQUEUE[{high_key!r}] ({high})."
                )
            )
    if "PARTITIONS" in raw and _is_number(raw["PARTITIONS"]) and raw["PARTITIONS"] > MAX_PARTITIONS:
        problems.append(
            Problem("sqlqueue.E004", f"SQLQUEUE['PARTITIONS'] is {raw['PARTITIONS']}; the maximum is {MAX_PARTITIONS}.")
        )
    if "METRICS_TOKEN" in raw:
        token = raw["METRICS_TOKEN"]
        # Printable ASCII without spaces: a header carries nothing else intact (WSGI decodes it
        # as Latin-1, a UTF-8 token never matches) and the view strips the spaces around it.
        if token is not None and not (isinstance(token, str) and _METRICS_TOKEN_RE.fullmatch(token)):
            got = f"a string of {len(token)} characters" if isinstance(token, str) else type(token).__name__
            if isinstance(token, str) and len(token) >= 16:
                got += " with a space, a control character or a non-ASCII character"
            problems.append(
                Problem(
                    "sqlqueue.E012",
                    "SQLQUEUE['METRICS_TOKEN'] must be None or a string of at least 16 printable ASCII characters "
                    f"without spaces (a Bearer token), got {got}.",
                    hint="Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'",
                )
            )
    if "NOTIFY" in raw and not isinstance(raw["NOTIFY"], bool):
        problems.append(Problem("sqlqueue.E014", f"SQLQUEUE['NOTIFY'] must be True or False, got {raw['NOTIFY']!r}."))
    if "HEALTH" in raw:
        problems += _validate_health(raw["HEALTH"])
    if "TOPICS" in raw:
        problems += _validate_topics(raw["TOPICS"])
    if "SCHEDULES" in raw:
        suffix = raw.get("DLQ_SUFFIX", DEFAULT_DLQ_SUFFIX)
        problems += _validate_schedules(raw["SCHEDULES"], suffix if isinstance(suffix, str) else DEFAULT_DLQ_SUFFIX)
    duration = raw.get("LEASE_DURATION", DEFAULT_LEASE_DURATION)
    renew = raw.get("LEASE_RENEW_INTERVAL", DEFAULT_LEASE_RENEW_INTERVAL)
    if _is_number(duration) and _is_number(renew) and renew >= duration:
        problems.append(
            Problem(
                "sqlqueue.E007",
                f"SQLQUEUE['LEASE_RENEW_INTERVAL'] ({renew}) must be shorter than "
                f"SQLQUEUE['LEASE_DURATION'] ({duration}), or live leases expire between renewals.",
                hint="Renew at most every LEASE_DURATION / 3 seconds.",
            )
        )
    return problems


def _validate_health(health: Any) -> list[Problem]:
    """Problems of ``SQLQUEUE["HEALTH"]``: thresholds by name, each None (off) or a value."""
    if not isinstance(health, dict):
        return [Problem("sqlqueue.E013", f"SQLQUEUE['HEALTH'] must be a dict, not {type(health).__name__}.")]
    problems: list[Problem] = []
    unknown = sorted(map(str, set(health) - set(HEALTH_KEYS)))
    if unknown:
        problems.append(
            Problem(
                "sqlqueue.E013",
                f"SQLQUEUE['HEALTH'] has unknown key(s): {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(HEALTH_KEYS)}.",
            )
        )
    for key, kind in HEALTH_KEYS.items():
        value = health.get(key)
        if value is None:
            continue
        if key == "REQUIRE_SUBSCRIBERS":
            ok = isinstance(value, bool)
        elif key == "MAX_LAG_SECONDS":
            ok = _is_seconds(value, zero=True)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not ok:
            problems.append(Problem("sqlqueue.E013", f"SQLQUEUE['HEALTH'][{key!r}] must be {kind}, got {value!r}."))
    return problems


def _validate_topics(topics: Any) -> list[Problem]:
    """Problems of ``SQLQUEUE["TOPICS"]``: topic name -> {"partitions": n} or {"per_key": True}."""
    if not isinstance(topics, dict):
        return [Problem("sqlqueue.E009", f"SQLQUEUE['TOPICS'] must be a dict, not {type(topics).__name__}.")]
    problems: list[Problem] = []
    for topic, options in topics.items():
        where = f"SQLQUEUE['TOPICS'][{topic!r}]"
        if not (
            isinstance(topic, str)
            and 0 < len(topic) <= MAX_TOPIC_LENGTH + MAX_DLQ_SUFFIX_LENGTH
            and TOPIC_RE.match(topic)
        ):
            problems.append(Problem("sqlqueue.E009", f"{where}: not a valid topic name ([A-Za-z0-9._-]+)."))
            continue
        if not isinstance(options, dict):
            problems.append(Problem("sqlqueue.E009", f"{where} must be a dict, not {type(options).__name__}."))
            continue
        unknown = sorted(map(str, set(options) - TOPIC_OPTION_KEYS))
        if unknown:
            problems.append(
                Problem(
                    "sqlqueue.E009",
                    f"{where} has unknown key(s): {', '.join(unknown)}.",
                    hint=f"Known keys: {', '.join(sorted(TOPIC_OPTION_KEYS))}.",
                )
            )
        partitions, per_key = options.get("partitions"), options.get("per_key", False)
        if not isinstance(per_key, bool):
            problems.append(Problem("sqlqueue.E009", f"{where}['per_key'] must be True or False, got {per_key!r}."))
        if per_key and partitions is not None:
            problems.append(
                Problem("sqlqueue.E009", f"{where}: a topic with one partition per key takes no 'partitions' count.")
            )
        if partitions is not None and not (
            isinstance(partitions, int) and not isinstance(partitions, bool) and 0 < partitions <= MAX_PARTITIONS
        ):
            problems.append(
                Problem(
                    "sqlqueue.E009",
                    f"{where}['partitions'] must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}.",
                )
            )
    return problems


def _validate_schedules(raw: Any, dlq_suffix: str) -> list[Problem]:
    from .schedules import parse_schedule

    if not isinstance(raw, dict):
        return [Problem("sqlqueue.E011", f"SQLQUEUE['SCHEDULES'] must be a dict, not {type(raw).__name__}.")]
    problems = []
    for name, spec in raw.items():
        try:
            parse_schedule(name, spec, dlq_suffix)
        except ConfigurationError as exc:
            problems.append(Problem("sqlqueue.E011", f"SQLQUEUE['SCHEDULES']: {exc}"))
    return problems


@functools.cache
def get_settings() -> QueueSettings:
    """Return the validated queue settings; raise ``ConfigurationError`` if invalid."""
    raw = getattr(django_settings, "SQLQUEUE", None)
    if raw is None:
        raw = {}
    problems = validate(raw)  # SQLQUEUE = [] or 0 is refused, as the system check says (E001)
    if problems:
        raise ConfigurationError(" ".join(f"[{p.id}] {p.msg}" for p in problems))
    values = dict(raw)
    for key in DURATION_KEYS:
        if key in values:
            values[key] = float(values[key])
    if "TOPICS" in values:
        values["TOPICS"] = {topic: dict(options) for topic, options in values["TOPICS"].items()}
    if "SCHEDULES" in values:
        values["SCHEDULES"] = {name: dict(spec) for name, spec in values["SCHEDULES"].items()}
    if "HEALTH" in values:
        values["HEALTH"] = dict(values["HEALTH"])
    return QueueSettings(**values)


@receiver(setting_changed)
def _reset_settings(*, setting: str, **kwargs: Any) -> None:
    if setting in ("SQLQUEUE", "DATABASES"):
        get_settings.cache_clear()
