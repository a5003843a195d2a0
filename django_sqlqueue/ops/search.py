"""Searching the log by a field of the JSON payload, bounded by a time window.

A payload field (``order_id = 42``, ``customer.id = "c-7"``) has no index: the database
must read each row to compare it. So a payload search always reads a bounded stretch of
the log: a time window (by default the last :data:`DEFAULT_WINDOW`, never wider than
:data:`MAX_WINDOW`) turned into a ``seq`` range by a bisection over the primary key
(``seq`` and ``published_at`` grow together: both are taken when the row is inserted).
The query reads that range of the primary key, or of the ``(topic, seq)`` index when a
topic is given, and compares the field there (``db/dialects/json_search.py``: typed,
exact JSON comparison on each database).

Bad input -- a path that is not dot-separated identifiers, a value that is not a JSON
scalar, a window too wide or inverted -- raises
:class:`~django_sqlqueue.ops.base.OperationError` before any query runs.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any

from django.db import connections
from django.db.models import BooleanField, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from ..db.dialects.json_search import JsonScalar, payload_match
from ..models import Message
from ..rules.limits import MAX_BIGINT
from .base import OperationError, brief_repr

#: The window of a payload search given no time bound: the last hour.
DEFAULT_WINDOW = dt.timedelta(hours=1)
#: The widest window a payload search reads: a day of the log.
MAX_WINDOW = dt.timedelta(hours=24)
#: Longest field path, and most keys in it.
MAX_PATH_LENGTH = 200
MAX_PATH_KEYS = 8
#: Longest string value searched for.
MAX_VALUE_LENGTH = 1000
#: Rows of slack around a seq bound found by time: concurrent inserts may commit their
#: published_at slightly out of seq order.
TIME_SLACK = 1000
#: The last time a datetime can hold: a "before" bound there has no time after it.
_LAST = dt.datetime.max.replace(tzinfo=dt.UTC)
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def field_path(text: str) -> tuple[str, ...]:
    """Return the keys of a dotted field path (``customer.id`` -> ``("customer", "id")``).

    Each key is an identifier (letters, digits, ``_``; not starting with a digit): at most
    :data:`MAX_PATH_KEYS` keys and :data:`MAX_PATH_LENGTH` characters. Anything else raises
    :class:`OperationError`.
    """
    if not isinstance(text, str) or not text:
        raise OperationError(f"field must be a dotted path of payload keys, e.g. customer.id, got {brief_repr(text)}.")
    if len(text) > MAX_PATH_LENGTH:
        raise OperationError(f"field is {len(text)} characters long; a path takes at most {MAX_PATH_LENGTH}.")
    keys = tuple(text.split("."))
    if len(keys) > MAX_PATH_KEYS:
        raise OperationError(f"field has {len(keys)} keys; a path takes at most {MAX_PATH_KEYS}.")
    bad = [k for k in keys if not _KEY.match(k)]
    if bad:
        raise OperationError(
            f"field {brief_repr(text)}: {brief_repr(bad[0])} is not a key name (letters, digits and _, "
            "not starting with a digit; keys joined by dots)."
        )
    return keys


def check_value(value: Any) -> JsonScalar:
    """Return ``value`` if it is a JSON scalar the search can compare; raise :class:`OperationError` otherwise."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -MAX_BIGINT - 1 <= value <= MAX_BIGINT:
            raise OperationError(
                f"value: integers from {-MAX_BIGINT - 1} to {MAX_BIGINT} only, got {brief_repr(value)}."
            )
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise OperationError(f"value must be a finite number, got {value!r}.")
        return value
    if isinstance(value, str):
        if len(value) > MAX_VALUE_LENGTH:
            raise OperationError(f"value is {len(value)} characters long; the search takes at most {MAX_VALUE_LENGTH}.")
        if "\x00" in value:
            raise OperationError("value must not contain NUL characters.")
        return value
    raise OperationError(
        f"value must be a string, a number, true, false or null (a JSON scalar), got {brief_repr(value)}."
    )


def parse_value(text: str) -> JsonScalar:
    """Read a typed value: JSON if it is a JSON scalar (``42``, ``true``, ``null``, ``"42"``), else the text itself.

    So ``42`` is the number and ``"42"`` (with quotes) the string; ``abc`` is the string ``abc``.
    """
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return check_value(text)
    if isinstance(value, dict | list):
        raise OperationError(f"value must be a string, a number, true, false or null, got {brief_repr(text)}.")
    return check_value(value)


def value_text(value: JsonScalar) -> str:
    """The inverse of :func:`parse_value`: the text that reads back as ``value``."""
    if isinstance(value, str):
        try:
            json.loads(value, parse_constant=_no_constant)
        except ValueError:
            return value
    return json.dumps(value, ensure_ascii=False)


def _no_constant(name: str) -> float:
    raise ValueError(name)  # NaN and Infinity are text, not numbers


def window(
    after: dt.datetime | None, before: dt.datetime | None, now: dt.datetime | None = None
) -> tuple[dt.datetime, dt.datetime]:
    """The time window of a payload search: the bounds given, completed and checked.

    No bound: the last :data:`DEFAULT_WINDOW`; only ``after``: up to now; only ``before``: the
    :data:`DEFAULT_WINDOW` before it. Wider than :data:`MAX_WINDOW`, or ending before it starts:
    :class:`OperationError`.
    """
    now = now or timezone.now()
    if after is None and before is None:
        after, before = now - DEFAULT_WINDOW, now
    elif after is None:
        assert before is not None
        after = before - DEFAULT_WINDOW
    elif before is None:
        before = max(now, after)
    if before < after:
        raise OperationError(f"the search window ends ({before.isoformat()}) before it starts ({after.isoformat()}).")
    if before - after > MAX_WINDOW:
        raise OperationError(
            f"a payload search reads at most {_hours(MAX_WINDOW)} of the log, and the window from "
            f"{after.isoformat()} to {before.isoformat()} is {_hours(before - after)}: narrow it "
            "(after/before), or leave both empty for the last hour."
        )
    return after, before


def _hours(span: dt.timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours:g} hours" if hours < 48 else f"{hours / 24:.1f} days"


def seq_bound(when: dt.datetime, using: str) -> int | None:
    """The smallest seq whose published_at is at or after ``when`` (None if none).

    A bisection over the primary key: about 2 * log2(rows) single-row index reads.
    """
    qs = Message.objects.using(using)
    low = qs.order_by("seq").values_list("seq", flat=True).first()
    high = qs.order_by("-seq").values_list("seq", flat=True).first()
    best = None
    while low is not None and high is not None and low <= high:
        mid = (low + high) // 2
        row = qs.filter(seq__gte=mid, seq__lte=high).order_by("seq").values_list("seq", "published_at").first()
        if row is None:
            high = mid - 1
        elif row[1] >= when:
            best, high = row[0], mid - 1
        else:
            low = row[0] + 1
    return best


def within(
    qs: QuerySet[Message], after: dt.datetime | None, before: dt.datetime | None, using: str
) -> QuerySet[Message]:
    """``qs`` narrowed to a seq range covering the rows published from ``after`` to ``before``.

    Only the seq range: the caller filters its own time column exactly (published_at, or a
    dead letter's failed_at, which is written with published_at in the same statement).
    """
    if after is not None:
        bound = seq_bound(after, using)
        if bound is None:
            return qs.none()
        qs = qs.filter(seq__gte=max(0, bound - TIME_SLACK))
    if before is not None and before < _LAST:
        # The first seq after ``before`` (none: nothing after it yet, no upper bound).
        bound = seq_bound(before + dt.timedelta(microseconds=1), using)
        if bound is not None:
            qs = qs.filter(seq__lt=bound + TIME_SLACK)
    return qs


def payload_equals(path: tuple[str, ...], value: JsonScalar, using: str) -> RawSQL:
    """A filter: the payload's JSON at ``path`` equals ``value`` (typed: ``42`` is not ``"42"``)."""
    connection = connections[using]
    qn = connection.ops.quote_name
    sql, params = payload_match(connection, f"{qn(Message._meta.db_table)}.{qn('payload')}", path, value)
    return RawSQL(sql, params, output_field=BooleanField())
