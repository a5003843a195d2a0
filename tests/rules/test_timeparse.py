"""The one ISO 8601 parser (``timeparse.parse_time``) and the places that wrap it."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
from django.core.management.base import CommandError

from django_sqlqueue.rules.timeparse import parse_time

UTC = dt.UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-31T12:00:00Z", dt.datetime(2026, 1, 31, 12, 0, tzinfo=UTC)),
        ("2026-01-31T12:00:00+02:00", dt.datetime(2026, 1, 31, 10, 0, tzinfo=UTC)),
        ("2026-01-31T12:00", dt.datetime(2026, 1, 31, 12, 0, tzinfo=UTC)),  # naive = UTC
        ("2026-01-31 12:00:00.250", dt.datetime(2026, 1, 31, 12, 0, 0, 250000, tzinfo=UTC)),
        ("2026-01-31", dt.datetime(2026, 1, 31, tzinfo=UTC)),  # a date alone: midnight
        ("2026-1-5 3:04", dt.datetime(2026, 1, 5, 3, 4, tzinfo=UTC)),  # Django's one-digit fields
        ("  2026-01-31T12:00Z ", dt.datetime(2026, 1, 31, 12, 0, tzinfo=UTC)),
    ],
)
def test_parse_time_accepts_iso_8601_and_returns_aware_utc(text: str, expected: dt.datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected
    assert parsed.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize("text", ["", "yesterday", "2026-13-01T00:00", "2026-02-30", "12:00"])
def test_parse_time_refuses_anything_else_with_a_value_error_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match="is not an ISO 8601 date and time") as info:
        parse_time(text)
    assert repr(text) in str(info.value)


def test_the_command_line_parser_raises_command_error() -> None:
    from django_sqlqueue.management.commands._console import parse_time as command_time

    assert command_time(None) is None
    assert command_time("2026-01-31T12:00") == dt.datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
    with pytest.raises(CommandError, match="not an ISO 8601"):
        command_time("2026-13-01")


def test_the_commands_argparse_type_raises_an_argument_type_error() -> None:
    """queue_pipeline's times: argparse turns the error into its one usage line (issue 28)."""
    import argparse

    from django_sqlqueue.management.commands._args import time as arg_time

    assert arg_time("2026-11-22T08:00+01:00") == dt.datetime(2026, 11, 22, 7, 0, tzinfo=UTC)
    with pytest.raises(argparse.ArgumentTypeError, match="must be an ISO 8601 date and time"):
        arg_time("soon")


def test_the_consoles_parser_raises_an_operation_error_naming_the_field() -> None:
    from django_sqlqueue.console.base import parse_time as form_time
    from django_sqlqueue.ops import OperationError

    assert form_time("", "failed after") is None
    assert form_time("2026-01-31T12:00", "failed after") == dt.datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
    with pytest.raises(OperationError, match="failed after: 'soon' is not a date and time"):
        form_time("soon", "failed after")


def test_the_spark_option_parser_raises_spark_option_error() -> None:
    from django_sqlqueue.spark.options import SparkOptionError, get_time

    assert get_time({}, "startTime") is None
    assert get_time({"starttime": "2026-01-31T12:00"}, "startTime") == dt.datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
    with pytest.raises(SparkOptionError, match="option 'startTime' must be an ISO 8601 time"):
        get_time({"starttime": "soon"}, "startTime")


def test_timeparse_and_the_spark_options_import_before_django_is_set_up() -> None:
    """Spark parses options in workers where Django is not configured: nothing may need settings."""
    code = (
        "import sys; from django_sqlqueue.spark.options import get_time; "
        "print(get_time({'starttime': '2026-01-31'}, 'startTime')); "
        "from django.conf import settings; assert not settings.configured"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2026-01-31 00:00:00+00:00"
