"""System checks for the ``SQLQUEUE`` setting, the queue database and the consumers.

Ids are stable and each means one thing; docs/checks.md lists them all with their fixes.
From :func:`conf.validate`: ``E001`` SQLQUEUE is not a dict, ``E002`` unknown keys, ``E003``
a bad duration, ``E004`` a bad positive integer, ``E005`` a bad DLQ suffix, ``E006`` an
unknown DATABASE alias, ``E007`` renewal not below the lease duration, ``E008`` a lower
bound above its upper bound, ``E009`` a bad TOPICS entry, ``E011`` a bad SCHEDULES entry,
``E012`` a bad METRICS_TOKEN, ``E013`` a bad HEALTH threshold, ``E014`` a NOTIFY,
PREPARED_STATEMENTS or SYNCHRONOUS_ACKS that is not a bool. From this module:
``sqlqueue.E010`` flags an unsupported database,
``sqlqueue.W001`` a MySQL queue connection that is not configured for READ COMMITTED,
``sqlqueue.W002`` a SQLite queue database whose transactions do not take the write lock at
BEGIN and ``sqlqueue.W003`` a consumed topic that no message has reached and nothing
declares (a likely typo; a database check, see :func:`check_consumer_topics`). From
``consumers.py``: ``sqlqueue.E015``, the package used without the app in INSTALLED_APPS.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.utils import load_backend

from . import conf
from .consumers import known_consumers, source_specs
from .exceptions import ConfigurationError
from .models import Message, Partition
from .schedules import all_schedules


@checks.register("sqlqueue")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    raw = getattr(settings, "SQLQUEUE", None)
    return [checks.Error(p.msg, hint=p.hint or None, id=p.id) for p in conf.validate(raw)]


@checks.register("sqlqueue")
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    raw = getattr(settings, "SQLQUEUE", None) or {}
    alias = raw.get("DATABASE", conf.DEFAULT_DATABASE) if isinstance(raw, dict) else conf.DEFAULT_DATABASE
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return []  # reported by sqlqueue.E006
    database = settings.DATABASES[alias]
    # The backend class, not connections[alias]: no connection is opened, and the check reads
    # the settings it is given (override_settings included), whatever engine subclass they name.
    try:
        vendor = load_backend(database.get("ENGINE") or "django.db.backends.dummy").DatabaseWrapper.vendor
    except (ImproperlyConfigured, ImportError):
        return []  # Django itself reports a backend it cannot load
    options = database.get("OPTIONS") or {}
    messages: list[checks.CheckMessage] = []
    if vendor not in ("mysql", "postgresql", "sqlite"):
        messages.append(
            checks.Error(
                f"Database {alias!r} uses {vendor!r}; django-sqlqueue supports MySQL/MariaDB, PostgreSQL and SQLite.",
                id="sqlqueue.E010",
            )
        )
    if vendor == "mysql":
        level = options.get("isolation_level")
        if (level or "").lower() != "read committed":
            messages.append(
                checks.Warning(
                    f"Database {alias!r} (the queue database) runs at {level or 'the server default isolation level'}, "
                    "not READ COMMITTED.",
                    hint="Set DATABASES[alias]['OPTIONS']['isolation_level'] = 'read committed': under REPEATABLE "
                    "READ, gap locks make concurrent consumers deadlock.",
                    id="sqlqueue.W001",
                )
            )
    if vendor == "sqlite":
        mode = options.get("transaction_mode")
        # IMMEDIATE (or EXCLUSIVE, the same in WAL mode) takes the write lock at BEGIN. Under the
        # default DEFERRED, a transaction that read first fails with "database is locked" when
        # it writes while another holds the lock, instead of waiting for it.
        if str(mode or "").upper() not in ("IMMEDIATE", "EXCLUSIVE"):
            messages.append(
                checks.Warning(
                    f"Database {alias!r} (the queue database) is SQLite with transaction_mode "
                    f"{mode or 'DEFERRED (the default)'}, not IMMEDIATE.",
                    hint="Set DATABASES[alias]['OPTIONS']['transaction_mode'] = 'IMMEDIATE': deferred transactions "
                    "fail with 'database is locked' when publishers and workers write at once.",
                    id="sqlqueue.W002",
                )
            )
    return messages


@dataclass(frozen=True)
class UnreachedTopic:
    """A consumed topic that no message has reached and nothing of the project declares."""

    topic: str
    groups: tuple[str, ...]
    #: Topic names close to it, nearest first: where a typo's messages go.
    nearest: tuple[str, ...]

    def describe(self) -> str:
        nearest = ", ".join(self.nearest) or "none"
        return (
            f"topic {self.topic!r} (consumed by {', '.join(self.groups)}) has never had a message and is not "
            f"declared in SQLQUEUE['TOPICS']; nearest known topics: {nearest}"
        )


#: How alike two topic names must be (difflib's ratio) for one to look like a typo of the other.
NEAR_MISS = 0.85


def unreached_topics(
    consumed: Iterable[tuple[str, str]], using: str, settings_: conf.QueueSettings
) -> list[UnreachedTopic]:
    """The topics of ``consumed`` ((group, topic) pairs) that look like a typo: no message has
    reached them, nothing declares them, and their name is a near miss of a known topic.

    A topic is above suspicion when a message has reached it -- one is in the log, or a
    partition's head offset is above 0 (the heads outlive the collected messages) -- or when
    the project declares it: ``SQLQUEUE["TOPICS"]``, a schedule's target, a task queue, a
    dead-letter topic. Queries (two cheap reads) only when some topic is suspect.
    """
    groups: dict[str, set[str]] = {}
    for group, topic in consumed:
        groups.setdefault(topic, set()).add(group)
    declared = set(settings_.TOPICS) | {s.topic for s in source_specs()}
    declared |= {s.topic for s in all_schedules(settings_.SCHEDULES, settings_.DLQ_SUFFIX) if s.topic}
    suspects = sorted(t for t in groups if t not in declared and not settings_.is_dlq_topic(t))
    if not suspects:
        return []
    from .db.store import QueueStore  # the data layer, only when there is something to look up

    reached = set(QueueStore(using).log_topics())
    reached |= set(Partition.objects.using(using).filter(head_offset__gt=0).values_list("topic", flat=True).distinct())
    known = sorted(t for t in reached | declared | set(groups) if not settings_.is_dlq_topic(t))
    found = []
    for topic in suspects:
        if topic in reached:
            continue
        # Only a near miss is reported: a consumer of a topic that simply has had no message
        # yet (a fresh database, a new feature) is normal, and a warning on every fresh
        # install would teach people to ignore it. At 0.85 a letter or two apart counts
        # ("order.created" / "orders.created": 0.96), siblings do not ("orders.updated" /
        # "orders.created": 0.79).
        near = difflib.get_close_matches(topic, [t for t in known if t != topic], n=3, cutoff=NEAR_MISS)
        if near:
            found.append(UnreachedTopic(topic, tuple(sorted(groups[topic])), tuple(near)))
    return found


def check_consumer_topics(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``sqlqueue.W003``: each consumed topic :func:`unreached_topics` suspects of a typo.

    A database check: Django runs it for ``check --database <alias>`` and ``migrate`` (it
    reads the queue database), never at import or for a plain ``check``. Silent when the
    queue's alias is not among ``databases``, the settings are invalid (``E0xx`` say so)
    or the tables do not exist yet (``migrate`` checks before it migrates).
    """
    try:
        settings_ = conf.get_settings()
    except ConfigurationError:
        return []
    alias = settings_.DATABASE
    if not databases or alias not in databases:
        return []
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            tables = set(connection.introspection.table_names(cursor))
        if not {Message._meta.db_table, Partition._meta.db_table} <= tables:
            return []
        found = unreached_topics(((s.group, s.topic) for s in known_consumers()), alias, settings_)
    except (DatabaseError, ConfigurationError):  # unreachable (Django's own checks say so), bad schedules
        return []
    return [
        checks.Warning(
            f"{u.describe()}.",
            hint=f"A typo in @consumer(...)? If {u.topic!r} is right and simply new, declare it in "
            f"SQLQUEUE['TOPICS'] (e.g. {{{u.topic!r}: {{}}}}) to silence this.",
            id="sqlqueue.W003",
        )
        for u in found
    ]


# Tagged "database" only, like Django's own database checks: `check --tag sqlqueue` (which on
# Django 6.1 hands every check all the aliases) stays a static check that opens no connection.
checks.register(check_consumer_topics, checks.Tags.database)
