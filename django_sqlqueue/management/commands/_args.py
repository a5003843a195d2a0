"""Argument types of the commands: every number, time and name an operator types is checked by
the parser, before a handler runs and so before anything is written.

A ``type=`` that raises :class:`argparse.ArgumentTypeError` makes argparse answer with one line
naming the option (``error: argument --limit: must be an integer from 1 to 10000, got '-5'``):
from the command line after the usage, with exit status 2; under ``call_command`` as a
``CommandError``. Values are shown with ``repr``, cut short, so that a control character or a
bidi override an operator pasted never reaches the terminal raw.

The bounds are in docs/commands.md. ``call_command(..., limit=-5)`` (a keyword, not an
argument string) skips the parser -- Django's rule for every command -- and meets the
service layer's own checks (``ops``) instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from django_sqlqueue.conf import MAX_PARTITIONS
from django_sqlqueue.rules.limits import (
    CONSUMER_GROUP_LENGTH,
    MAX_BATCH_SIZE,
    MAX_BIGINT,
    MAX_LIST_LIMIT,
    MAX_SECONDS,
    TOPIC_COLUMN_LENGTH,
    TOPIC_RE,
)
from django_sqlqueue.rules.timeparse import parse_time

#: Most rows one listing prints (``queue_dlq list --limit``): the ops layer's bound.
MAX_LIMIT = MAX_LIST_LIMIT
#: Most rows one transaction writes or deletes (every ``--batch-size``): the ops layer's
#: bound (a bigger batch only holds its locks longer).
MAX_BATCH = MAX_BATCH_SIZE
#: Most handler threads of one worker (``runconsumer --concurrency``). Each holds a database
#: connection of its own (worker/budget.py): 256 is already above the default connection limit
#: of MySQL/MariaDB (151) and PostgreSQL (100); 100000 failed with "can't start new thread".
MAX_CONCURRENCY = 256
#: Longest history of ``queue_pipeline report --hours``: a leap year.
MAX_REPORT_HOURS = 366 * 24
#: Longest free-text argument that is not a name (``--error``, paths, Spark settings): PATH_MAX.
MAX_TEXT_LENGTH = 4096

#: NUL cannot be sent to PostgreSQL; lone surrogates are the bytes of an argument that were not
#: UTF-8 (Python decodes argv with surrogateescape) and no database driver can encode them; the
#: rest are C0/C1 controls and bidi overrides, which no name or filter of the queue contains.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def shown(value: object, width: int = 60) -> str:
    """``repr(value)``, at most ``width`` characters: safe to print and short enough for one line."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a decimal integer from ``low`` to ``high``."""

    def parse(value: str) -> int:
        try:
            number = int(str(value), 10)
        except ValueError:  # also a string of more than 4300 digits
            number = None
        if number is None or not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}, got {shown(value)}")
        return number

    parse.__name__ = f"integer from {low} to {high}"
    return parse


def _number(value: float) -> str:
    """``3153600000``, not ``3.1536e+09``."""
    return str(int(value)) if float(value).is_integer() else str(value)


def bounded_float(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number from ``low`` to ``high`` (``nan`` and ``inf`` are refused)."""

    def parse(value: str) -> float:
        try:
            number = float(str(value))
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or not low <= number <= high:
            raise argparse.ArgumentTypeError(
                f"must be a number from {_number(low)} to {_number(high)}, got {shown(value)}"
            )
        return number

    parse.__name__ = f"number from {_number(low)} to {_number(high)}"
    return parse


#: ``--limit``: rows of one page.
limit = bounded_int(1, MAX_LIMIT)
#: ``--batch-size``: rows of one transaction.
batch_size = bounded_int(1, MAX_BATCH)
#: A seq, a cursor: a row's BIGINT key (1 and up).
seq = bounded_int(1, MAX_BIGINT)
#: An offset: 0 and up, within BIGINT.
offset = bounded_int(0, MAX_BIGINT)
#: A topic's partition count.
partition_count = bounded_int(1, MAX_PARTITIONS)
#: A duration in seconds (``--older-than``, ``--max-lag-seconds``).
seconds = bounded_float(0, MAX_SECONDS)


def partitions(value: str) -> list[int]:
    """An argparse type: comma-separated partition numbers (``0,3,5``), each below MAX_PARTITIONS."""
    items = [item.strip() for item in str(value).split(",")]
    if len(items) > MAX_PARTITIONS or not all(items):
        raise argparse.ArgumentTypeError(f"must be partition numbers separated by commas, got {shown(value)}")
    parse = bounded_int(0, MAX_PARTITIONS - 1)
    try:
        return sorted({parse(item) for item in items})
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be partition numbers from 0 to {MAX_PARTITIONS - 1} separated by commas, got {shown(value)}"
        ) from None


def time(value: str) -> dt.datetime:
    """An argparse type: an ISO 8601 date and time, an aware UTC datetime (naive = UTC)."""
    try:
        return parse_time(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an ISO 8601 date and time (e.g. 2026-01-31T12:00:00Z; naive times are UTC), got {shown(value)}"
        ) from None


def name_of(what: str, max_length: int) -> Callable[[str], str]:
    """An argparse type: a topic or group name (``[A-Za-z0-9._-]``, 1..max_length characters).

    Stored names all follow this rule (``rules/validation.py``), so a filter that breaks it
    could match nothing: it is refused instead of printing an empty list.
    """

    def parse(value: str) -> str:
        if not 0 < len(value) <= max_length or not TOPIC_RE.match(value):
            raise argparse.ArgumentTypeError(
                f"must be a {what}: 1 to {max_length} of A-Z a-z 0-9 . _ -, got {shown(value)}"
            )
        return value

    parse.__name__ = what
    return parse


#: A topic (a dead-letter topic's name is longer: the column's width).
topic = name_of("topic", TOPIC_COLUMN_LENGTH)
#: A consumer group.
group = name_of("consumer group", CONSUMER_GROUP_LENGTH)


def text(max_length: int = MAX_TEXT_LENGTH) -> Callable[[str], str]:
    """An argparse type: free text of at most ``max_length`` characters, printable and UTF-8."""

    def parse(value: str) -> str:
        if len(value) > max_length:
            raise argparse.ArgumentTypeError(f"must be at most {max_length} characters, got {len(value)}")
        if _UNPRINTABLE.search(value):
            raise argparse.ArgumentTypeError(
                f"must not contain control characters, bidi overrides or bytes that are not UTF-8, got {shown(value)}"
            )
        return value

    parse.__name__ = "text"
    return parse


def checked(value: Any, option: str, kind: Callable[[str], Any]) -> Any:
    """Apply ``kind`` to a value that did not come through the parser (None passes): a
    ``CommandError`` in argparse's words."""
    if value is None:
        return None
    try:
        return kind(value)
    except argparse.ArgumentTypeError as exc:
        raise CommandError(f"argument {option}: {exc}") from None
