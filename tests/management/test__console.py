"""management/commands/_console.py: the plumbing of queue_dlq, queue_group and queue_topic --
text tables, JSON of the ops results, ISO times, and confirmation of destructive actions."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.management import CommandError

from django_sqlqueue.management.commands._console import SubcommandCommand, parse_time, table, to_jsonable


def test_a_table_aligns_its_columns_and_shows_none_as_a_dash() -> None:
    assert table(("group", "lag", "leased by"), [("billing", 4, "w1"), ("retired-group", 20, None)]) == [
        "group          lag  leased by",
        "billing        4    w1",
        "retired-group  20   -",
    ]
    assert table(("topic",), []) == ["topic"]


@dataclass
class Row:
    head: int
    watermark: int
    at: dt.datetime

    @property
    def lag(self) -> int:
        return self.head - self.watermark


def test_json_of_a_result_carries_its_computed_numbers_and_iso_times() -> None:
    at = dt.datetime(2026, 1, 31, 12, 0, tzinfo=dt.UTC)
    assert to_jsonable({"rows": (Row(10, 4, at),), 7: None}) == {
        "rows": [{"head": 10, "watermark": 4, "at": "2026-01-31T12:00:00+00:00", "lag": 6}],
        "7": None,
    }


def test_times_are_iso_8601_naive_ones_utc() -> None:
    assert parse_time("2026-01-31T12:00") == dt.datetime(2026, 1, 31, 12, 0, tzinfo=dt.UTC)
    assert parse_time("") is None and parse_time(None) is None
    with pytest.raises(CommandError, match="'yesterday' is not an ISO 8601 date and time"):
        parse_time("yesterday")


def test_a_destructive_action_is_confirmed_or_refused_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    command = SubcommandCommand()
    command.confirm({"yes": True}, "Purge?")
    command.confirm({"interactive": False}, "Purge?")  # --noinput of call_command
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(CommandError, match="Purge\\? -- refusing without confirmation: pass --yes"):
        command.confirm({}, "Purge?")
    answers: list[Any] = []
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda question: answers.append(question) or "n")
    with pytest.raises(CommandError, match="aborted, nothing was changed"):
        command.confirm({}, "Purge?")
    monkeypatch.setattr("builtins.input", lambda question: " Yes ")
    command.confirm({}, "Purge?")
    assert answers == ["Purge? [y/N] "]
