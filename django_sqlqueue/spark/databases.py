"""Which database a use of the data source reads or writes: the topics' route, or option ``using``.

``SQLQUEUE["TOPIC_DATABASES"]`` spreads topics over database aliases (``rules/routes.py``).
The Python workers of Spark have no Django project to ask, so :func:`sqlqueue_options`
(in the driver) puts every alias of the queue in the options: ``databases`` (per alias:
engine, host, port, name, user, driver options) and ``passwords`` (per alias, an option of
its own whose name Spark's ``spark.redaction.regex`` redacts in plans and the UI).
:func:`choose_database` then picks one alias per use, before anything is planned:

- option ``using`` (a Django alias) when given -- also set by ``sqlqueue_options("alias")``;
  an alias the options do not hold is refused, naming the ones they hold;
- else the alias that holds the topics (``database_for``: the most specific pattern wins,
  a dead-letter topic lives with its topic);
- topics of *different* databases in one read are refused: a read is planned, sequenced
  and (with ``group``) committed in one database, and a stream's offsets and a group's
  watermarks cannot be written atomically in two. Read each database separately and
  union the DataFrames;
- ``subscribePattern`` cannot be routed (the topics are found in the database): with
  routes it needs ``using``; without routes it reads ``SQLQUEUE["DATABASE"]``.

The chosen connection then replaces the flat connection options (``engine``, ``host``,
``database`` ...), which the rest of the data source reads (``runtime.database``).
Options built by hand, without ``databases``, keep their one connection.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..conf import DEFAULT_DATABASE, DEFAULT_DLQ_SUFFIX
from ..rules.routes import route
from .options import SparkOptionError

#: The per-connection options of one alias in ``databases`` (its password is in ``passwords``,
#: :func:`~.options.connection_entry` builds them).
FIELDS = ("engine", "host", "port", "database", "user", "dboptions")


def _json(options: Mapping[str, str], name: str) -> dict[str, Any]:
    raw = options.get(name)
    if raw in (None, ""):
        return {}
    try:
        value = json.loads(str(raw))
    except ValueError as exc:
        raise SparkOptionError(f"option {name!r} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise SparkOptionError(f"option {name!r} must be a JSON object, got {type(value).__name__}.")
    return value


def topic_databases(options: Mapping[str, str], topics: Sequence[str]) -> dict[str, list[str]]:
    """Return ``{alias: [topics it holds]}`` under the options' ``SQLQUEUE`` settings."""
    queue = _json(options, "sqlqueue")
    routes = queue.get("TOPIC_DATABASES") or {}
    default = str(queue.get("DATABASE") or DEFAULT_DATABASE)
    suffix = str(queue.get("DLQ_SUFFIX") or DEFAULT_DLQ_SUFFIX)
    held: dict[str, list[str]] = {}
    for topic in topics:
        held.setdefault(route(topic, routes, default, suffix), []).append(topic)
    return held


def choose_database(options: Mapping[str, str], topics: Sequence[str], use: str) -> dict[str, str]:
    """Return ``options`` set to the connection of the one database ``topics`` (or ``using``) name.

    ``topics`` empty means a ``subscribePattern``. Raise :class:`SparkOptionError` for an
    unknown ``using``, a pattern that routes cannot place, or topics of several databases.
    """
    databases = _json(options, "databases")
    using = str(options.get("using", "") or "").strip()
    if not databases:
        if using:
            raise SparkOptionError(
                f"sqlqueue {use}: option 'using' ({using!r}) needs the options of "
                "django_sqlqueue.spark.sqlqueue_options(), which hold every database of the queue."
            )
        return dict(options)
    _refuse_alias_as_name(options, databases, use)
    if using:
        alias = using
    else:
        queue = _json(options, "sqlqueue")
        if not topics:
            if queue.get("TOPIC_DATABASES"):
                raise SparkOptionError(
                    f"sqlqueue {use}: option 'subscribePattern' finds topics in one database, and "
                    "SQLQUEUE['TOPIC_DATABASES'] spreads them over several: name the database with option "
                    f"'using' (one of {', '.join(sorted(databases))})."
                )
            alias = str(queue.get("DATABASE") or DEFAULT_DATABASE)
        else:
            held = topic_databases(options, topics)
            if len(held) > 1:
                where = "; ".join(f"{', '.join(map(repr, found))} in {alias!r}" for alias, found in held.items())
                raise SparkOptionError(
                    f"sqlqueue {use}: the topics live in different databases (SQLQUEUE['TOPIC_DATABASES']): {where}. "
                    "A read covers one database: read each database's topics separately and union the DataFrames."
                )
            (alias,) = held
    if alias not in databases:
        raise SparkOptionError(
            f"sqlqueue {use}: database alias {alias!r} is not one the options hold "
            f"({', '.join(sorted(databases))}); build them with sqlqueue_options({alias!r}) if it is a "
            "settings.DATABASES alias."
        )
    entry = databases[alias]
    if not isinstance(entry, dict) or not entry.get("engine") or not entry.get("database"):
        raise SparkOptionError(f"sqlqueue {use}: option 'databases' has no connection for {alias!r}.")
    chosen = dict(options)
    chosen.update({name: str(entry.get(name, "")) for name in FIELDS})
    chosen["password"] = str(_json(options, "passwords").get(alias, ""))
    chosen["using"] = alias
    return chosen


def _refuse_alias_as_name(options: Mapping[str, str], databases: Mapping[str, Any], use: str) -> None:
    """Refuse ``.option("database", "<alias>")``: ``database`` is the connection's database *name*."""
    name = str(options.get("database", "") or "")
    names = {str(entry.get("database")) for entry in databases.values() if isinstance(entry, dict)}
    if name and name in databases and name not in names:
        raise SparkOptionError(
            f"sqlqueue {use}: option 'database' is the connection's database name, and {name!r} is a Django alias: "
            f"choose a database with option 'using' ({name!r})."
        )


def with_database(options: Mapping[str, str], alias: str) -> dict[str, str]:
    """Return ``options`` that read and write database ``alias`` whatever the topics' routes.

    Options built by hand (without ``databases``) are returned as they are: their one
    connection is the database.
    """
    return {**options, "using": alias} if options.get("databases") else dict(options)


def chosen_alias(options: Mapping[str, str], topics: Sequence[str], default: str) -> str:
    """Return the Django alias :func:`choose_database` picks for ``topics`` (``default`` for
    options built by hand, which name no alias)."""
    return choose_database(options, topics, "read").get("using") or default
