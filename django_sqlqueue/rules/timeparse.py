"""One parser of ISO 8601 times given by people: commands, the console, pipelines, Spark options.

A leaf: it imports nothing of the package, and of Django only ``django.utils.dateparse``,
which needs neither settings nor the app registry -- Spark's option parsing runs in
workers where Django is not set up yet. Each caller turns the ``ValueError`` into its own
error type (``CommandError``, a console form error, ``SparkOptionError``).
"""

from __future__ import annotations

import datetime as dt

from django.utils.dateparse import parse_datetime


def parse_time(value: str) -> dt.datetime:
    """Parse an ISO 8601 date and time; return it as an aware UTC datetime.

    Accept what ``datetime.fromisoformat`` accepts (a date alone is midnight) and Django's
    ``parse_datetime`` forms (a space for the ``T``, one-digit fields, ``Z``). A time
    without an offset is UTC. Raise ``ValueError`` naming the value otherwise.
    """
    text = str(value).strip()
    try:
        parsed = parse_datetime(text)
    except ValueError:  # well formed, but not a date (month 13, February 30)
        parsed = None
    if parsed is None:
        raise ValueError(
            f"{value!r} is not an ISO 8601 date and time (e.g. 2026-01-31T12:00:00Z; naive times are UTC)."
        )
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=dt.UTC)
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise ValueError(f"{value!r} is out of range in UTC (years 1 to 9999).") from None
