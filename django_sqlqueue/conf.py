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
import re
from dataclasses import dataclass, field, fields
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import ConfigurationError
from .rules import dlq
from .rules.limits import DEFAULT_DLQ_SUFFIX, MAX_DLQ_SUFFIX_LENGTH, MAX_SECONDS, TOPIC_RE
from .rules.routes import aliases, route, route_problems
from .rules.settings_checks import (  # noqa: F401 (re-exported: the settings' limits, where readers look)
    HEALTH_KEYS,
    MAX_PARTITIONS,
    TOPIC_OPTION_KEYS,
    Problem,
    is_number,
    is_seconds,
    validate_health,
    validate_topics,
)

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
#: A METRICS_TOKEN (check E012): at least 16 printable ASCII characters, no space.
_METRICS_TOKEN_RE = re.compile(r"[\x21-\x7e]{16,}")
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
    #: PostgreSQL: run the worker's hot statements (poll state, fetch, sequencing, recording
    #: deliveries and acks) as server-side prepared statements, planned once per connection
    #: (db/store/base.py). False behind PgBouncer in transaction mode before 1.21 (or with
    #: ``max_prepared_statements = 0``), which cannot keep a prepared statement.
    PREPARED_STATEMENTS: bool = True
    #: PostgreSQL: False (the default) lets a worker's delivery records and acks commit
    #: without waiting for the WAL flush (``synchronous_commit = off`` for those transactions
    #: only). Only a crash of the database server can forget them, the last fraction of a
    #: second's; their messages are then delivered again. True: wait for the flush.
    SYNCHRONOUS_ACKS: bool = False
    #: Bearer token of the Prometheus view (``django_sqlqueue.metrics.views.metrics``); None: staff only.
    METRICS_TOKEN: str | None = None
    #: Health thresholds of ``queue_health`` and the console's overview (django_sqlqueue.ops.health):
    #: ``{"MAX_LAG": 1000, "MAX_LAG_SECONDS": 300, "MAX_DEAD_LETTERS": 0, "REQUIRE_SUBSCRIBERS": True}``.
    HEALTH: dict[str, Any] = field(default_factory=dict)
    #: Per-topic options: ``{"orders": {"partitions": 16}, "tenants": {"per_key": True}}``.
    TOPICS: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Topics held by other databases than ``DATABASE``: ``{"orders.*": "orders"}`` (rules/routes.py).
    TOPIC_DATABASES: dict[str, str] = field(default_factory=dict)

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

    def database_for(self, topic: str) -> str:
        """Return the alias of the database that holds ``topic`` (its dead-letter topic's too)."""
        return route(topic, self.TOPIC_DATABASES, self.DATABASE, self.DLQ_SUFFIX)

    @property
    def databases(self) -> list[str]:
        """Every alias that holds queue tables: ``DATABASE`` first, then ``TOPIC_DATABASES``'s."""
        return aliases(self.TOPIC_DATABASES, self.DATABASE)


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
        if key in raw and not is_seconds(raw[key]):
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
        if key in raw and not is_seconds(raw[key], zero=True):
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
        if is_number(low) and is_number(high) and low > high:
            problems.append(
                Problem(
                    "sqlqueue.E008", f"SQLQUEUE[{low_key!r}] ({low}) must not exceed SQLQUEUE[{high_key!r}] ({high})."
                )
            )
    if "PARTITIONS" in raw and is_number(raw["PARTITIONS"]) and raw["PARTITIONS"] > MAX_PARTITIONS:
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
    for flag in ("NOTIFY", "PREPARED_STATEMENTS", "SYNCHRONOUS_ACKS"):
        if flag in raw and not isinstance(raw[flag], bool):
            problems.append(Problem("sqlqueue.E014", f"SQLQUEUE['{flag}'] must be True or False, got {raw[flag]!r}."))
    if "HEALTH" in raw:
        problems += validate_health(raw["HEALTH"])
    if "TOPICS" in raw:
        problems += validate_topics(raw["TOPICS"])
    if "TOPIC_DATABASES" in raw:
        problems += [
            Problem("sqlqueue.E016", msg) for msg in route_problems(raw["TOPIC_DATABASES"], django_settings.DATABASES)
        ]
    if "SCHEDULES" in raw:
        suffix = raw.get("DLQ_SUFFIX", DEFAULT_DLQ_SUFFIX)
        problems += _validate_schedules(raw["SCHEDULES"], suffix if isinstance(suffix, str) else DEFAULT_DLQ_SUFFIX)
    duration = raw.get("LEASE_DURATION", DEFAULT_LEASE_DURATION)
    renew = raw.get("LEASE_RENEW_INTERVAL", DEFAULT_LEASE_RENEW_INTERVAL)
    if is_number(duration) and is_number(renew) and renew >= duration:
        problems.append(
            Problem(
                "sqlqueue.E007",
                f"SQLQUEUE['LEASE_RENEW_INTERVAL'] ({renew}) must be shorter than "
                f"SQLQUEUE['LEASE_DURATION'] ({duration}), or live leases expire between renewals.",
                hint="Renew at most every LEASE_DURATION / 3 seconds.",
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
    if "TOPIC_DATABASES" in values:
        values["TOPIC_DATABASES"] = dict(values["TOPIC_DATABASES"])
    return QueueSettings(**values)


@receiver(setting_changed)
def _reset_settings(*, setting: str, **kwargs: Any) -> None:
    if setting in ("SQLQUEUE", "DATABASES"):
        get_settings.cache_clear()
