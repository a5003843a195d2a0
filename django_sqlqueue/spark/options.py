"""Options of the ``sqlqueue`` data source, and the helper that builds them from Django.

Spark hands a Python data source its options lower-cased and as strings, in every
process that runs a piece of it (the planner and the executors are separate Python
workers, possibly on other machines). The database connection therefore travels in the
options: :func:`sqlqueue_options` copies it from ``settings.DATABASES`` (and the queue's
``SQLQUEUE`` settings), so a job never repeats credentials::

    spark.read.format("sqlqueue").options(**sqlqueue_options()).option("topic", "orders").load()

The password is its own option, ``password`` (and ``passwords``, of every database):
Spark redacts options whose name matches ``spark.redaction.regex`` (``password`` does)
in plans and the UI. Which of the queue's databases a use reads or writes: databases.py.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigurationError
from ..rules.limits import CONSUMER_GROUP_LENGTH, MAX_DLQ_SUFFIX_LENGTH, MAX_TOPIC_LENGTH, TOPIC_RE
from ..rules.timeparse import parse_time

#: Option names of the connection (all lower-case, as Spark delivers them).
#: ``databases``/``passwords``/``using``: every database of the queue and the one chosen (databases.py).
CONNECTION_OPTIONS = (
    "engine",
    "host",
    "port",
    "database",
    "user",
    "password",
    "dboptions",
    "sqlqueue",
    "databases",
    "passwords",
    "using",
)


class SparkOptionError(ConfigurationError):
    """A ``sqlqueue`` data source option is missing or invalid."""


def sqlqueue_options(alias: str | None = None) -> dict[str, str]:
    """Return the data source options: the queue's databases, and ``alias`` when one is named.

    Call it in the driver, where Django is set up. The result holds the connection
    (engine, host, port, database name, user, password, driver options) of *every*
    database of the queue (``SQLQUEUE["DATABASE"]`` and the aliases of
    ``SQLQUEUE["TOPIC_DATABASES"]``: the *current* settings, so under a test runner the
    test databases), plus the ``SQLQUEUE`` settings, so executors hash keys to the same
    partitions as ``publish()`` and route topics to the same databases. Each read or
    write then uses the database of its topics; ``alias`` (a ``settings.DATABASES`` alias,
    which also sets option ``using``) makes every use of these options take that one.
    """
    from django.conf import settings
    from django.db import connections

    from ..conf import get_settings

    conf = get_settings()
    alias = alias or None
    if alias is not None and alias not in settings.DATABASES:
        raise ConfigurationError(
            f"database alias {alias!r} is not in settings.DATABASES ({', '.join(settings.DATABASES)})."
        )
    main = alias or conf.DATABASE
    aliases = [a for a in dict.fromkeys([*conf.databases, main]) if a in settings.DATABASES]
    entries = {a: connections[a].settings_dict for a in aliases}
    raw = getattr(settings, "SQLQUEUE", None) or {}
    options = {
        **connection_entry(entries[main]),
        "password": str(entries[main].get("PASSWORD") or ""),
        "sqlqueue": json.dumps(raw, sort_keys=True),
        "databases": json.dumps({a: connection_entry(db) for a, db in entries.items()}, sort_keys=True),
        "passwords": json.dumps({a: str(db.get("PASSWORD") or "") for a, db in entries.items()}, sort_keys=True),
    }
    if alias is not None:
        options["using"] = alias
    return options


def connection_entry(settings_dict: Mapping[str, Any]) -> dict[str, str]:
    """Return the options of one ``DATABASES`` entry, without its password."""
    return {
        "engine": str(settings_dict["ENGINE"]),
        "host": str(settings_dict.get("HOST") or ""),
        "port": str(settings_dict.get("PORT") or ""),
        "database": str(settings_dict["NAME"]),
        "user": str(settings_dict.get("USER") or ""),
        "dboptions": json.dumps(settings_dict.get("OPTIONS") or {}, sort_keys=True, default=str),
    }


def jdbc_url(options: Mapping[str, str]) -> str:
    """Return the ``jdbc:mysql://`` URL of MySQL/MariaDB connection options.

    Spark picks its MySQL dialect only for ``jdbc:mysql://`` URLs (with ``jdbc:mariadb://``
    it falls back to a generic dialect under which filtered reads return nothing).
    ``useCursorFetch`` makes the driver stream results instead of buffering them whole.
    """
    engine = options.get("engine", "")
    if not engine.endswith("mysql"):
        raise SparkOptionError(f"the JDBC reader needs a MySQL/MariaDB database, not {engine!r}.")
    host = options.get("host") or "127.0.0.1"
    port = options.get("port") or "3306"
    return (
        f"jdbc:mysql://{host}:{port}/{options['database']}"
        "?permitMysqlScheme&useCursorFetch=true&defaultFetchSize=10000&connectionTimeZone=UTC"
    )


@dataclass(frozen=True)
class Connection:
    """The database part of the options: a Django ``DATABASES`` entry and ``SQLQUEUE``."""

    engine: str
    host: str
    port: str
    database: str
    user: str
    password: str
    dboptions: dict[str, Any]
    sqlqueue: dict[str, Any]

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Connection:
        missing = [name for name in ("engine", "database") if not options.get(name)]
        if missing:
            raise SparkOptionError(
                f"sqlqueue data source: missing option(s) {', '.join(missing)}; pass "
                "**django_sqlqueue.spark.sqlqueue_options() (built from settings.DATABASES)."
            )
        return cls(
            engine=options["engine"],
            host=options.get("host", ""),
            port=options.get("port", ""),
            database=options["database"],
            user=options.get("user", ""),
            password=options.get("password", ""),
            dboptions=_json_option(options, "dboptions", {}),
            sqlqueue=_json_option(options, "sqlqueue", {}),
        )

    def django_database(self) -> dict[str, Any]:
        """Return the ``DATABASES`` entry of this connection."""
        return {
            "ENGINE": self.engine,
            "NAME": self.database,
            "USER": self.user,
            "PASSWORD": self.password,
            "HOST": self.host,
            "PORT": self.port,
            "OPTIONS": dict(self.dboptions),
        }


def _json_option(options: Mapping[str, str], name: str, default: Any) -> Any:
    value = options.get(name)
    if value in (None, ""):
        return default
    try:
        return json.loads(value)
    except ValueError as exc:
        raise SparkOptionError(f"option {name!r} is not valid JSON: {exc}") from exc


def get_str(options: Mapping[str, str], name: str, default: str = "") -> str:
    return str(options.get(name.lower(), default))


def get_int(options: Mapping[str, str], name: str, default: int | None, *, minimum: int = 0) -> int | None:
    """Return an integer option (Spark delivers strings), or ``default``."""
    value = options.get(name.lower())
    if value in (None, ""):
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise SparkOptionError(f"option {name!r} must be an integer, got {value!r}.") from None
    if number < minimum:
        raise SparkOptionError(f"option {name!r} must be >= {minimum}, got {number}.")
    return number


def get_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name.lower())
    if value in (None, ""):
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise SparkOptionError(f"option {name!r} must be true or false, got {value!r}.")


def get_time(options: Mapping[str, str], name: str) -> dt.datetime | None:
    """Return an ISO 8601 time option as an aware UTC datetime (naive = UTC)."""
    value = options.get(name.lower())
    if value in (None, ""):
        return None
    try:
        return parse_time(str(value))
    except ValueError:
        raise SparkOptionError(f"option {name!r} must be an ISO 8601 time, got {value!r}.") from None


def get_duration(options: Mapping[str, str], name: str, default: float) -> float:
    """Return a duration option in seconds: ``500ms``, ``30s``, ``15m``, ``1h`` or plain seconds."""
    value = str(options.get(name.lower(), "") or "").strip().lower()
    if not value:
        return default
    units = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
    number, unit = value, "s"
    for suffix in sorted(units, key=len, reverse=True):
        if value.endswith(suffix):
            number, unit = value[: -len(suffix)].strip(), suffix
            break
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise SparkOptionError(
            f"option {name!r} must be a duration such as 30s, 15m or 500ms, got {value!r}."
        ) from None
    if seconds < 0:
        raise SparkOptionError(f"option {name!r} must not be negative, got {value!r}.")
    return seconds


def get_group(options: Mapping[str, str]) -> str | None:
    """Return the ``group`` option (a consumer group name), validated, or None."""
    group = str(options.get("group", "") or "").strip()
    if not group:
        return None
    if len(group) > CONSUMER_GROUP_LENGTH or not TOPIC_RE.match(group):
        raise SparkOptionError(
            f"option 'group' {group!r} is not a valid consumer group (at most {CONSUMER_GROUP_LENGTH} characters "
            "of [A-Za-z0-9._-])."
        )
    return group


def get_topics(options: Mapping[str, str]) -> list[str]:
    """Return the topics of the ``topic`` option (comma-separated), validated."""
    raw = options.get("topic") or options.get("topics") or ""
    topics = [t.strip() for t in str(raw).split(",") if t.strip()]
    if not topics:
        raise SparkOptionError(
            "sqlqueue data source: option 'topic' is required (one topic, or several comma-separated)."
        )
    # The rules of validation.validate_topic, which needs the app registry (not ready while
    # Spark plans); DLQ topics are longer than publishers' topics: the full column width.
    for topic in topics:
        if len(topic) > MAX_TOPIC_LENGTH + MAX_DLQ_SUFFIX_LENGTH or not TOPIC_RE.match(topic):
            raise SparkOptionError(
                f"topic {topic!r} is not a valid topic (at most {MAX_TOPIC_LENGTH + MAX_DLQ_SUFFIX_LENGTH} "
                "characters of [A-Za-z0-9._-])."
            )
    return topics
