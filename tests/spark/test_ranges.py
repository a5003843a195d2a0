"""spark/ranges.py: the offsets and times a read asks for, parsed from its options.

Spark hands the options over with lower-case names. Reads that use them: tests/spark/test_source.py
and test_stream.py.
"""

from __future__ import annotations

import datetime as dt

import pytest

from django_sqlqueue.spark.options import SparkOptionError
from django_sqlqueue.spark.ranges import EVERY_PARTITION, parse_positions, parse_timestamps, positions_of

JAN_31 = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC)


def test_offsets_are_given_per_partition_or_per_topic_or_not_at_all() -> None:
    assert parse_positions({}, "startingOffsets", "earliest") is None
    assert parse_positions({"startingoffsets": " Earliest "}, "startingOffsets", "earliest") is None
    flat = parse_positions({"startingoffsets": '{"0": 5, "3": 7}'}, "startingOffsets", "earliest")
    assert flat == {"*": {0: 5, 3: 7}}
    by_topic = parse_positions({"endingoffsets": '{"a": {"1": 9}, "b": {}}'}, "endingOffsets", "latest")
    assert by_topic == {"a": {1: 9}, "b": {}}
    assert positions_of(by_topic, "a") == {1: 9} and positions_of(by_topic, "c") == {}
    assert positions_of(flat, "any") == {0: 5, 3: 7} and positions_of(None, "a") is None
    for bad in ("[1]", '{"x": 1}', "5", '{"0": "five"}'):
        with pytest.raises(SparkOptionError, match="option 'startingOffsets' must be earliest or JSON"):
            parse_positions({"startingoffsets": bad}, "startingOffsets", "earliest")


def test_starting_times_are_milliseconds_or_iso_for_every_partition_or_some() -> None:
    assert parse_timestamps({}) is None
    millis = str(int(JAN_31.timestamp() * 1000))
    assert parse_timestamps({"startingtimestamp": millis}) == {"*": {EVERY_PARTITION: JAN_31}}
    assert parse_timestamps({"startingtimestamp": "2026-01-31T12:00"}) == {"*": {EVERY_PARTITION: JAN_31}}
    per_partition = parse_timestamps({"startingoffsetsbytimestamp": f'{{"2": {millis}}}'})
    assert per_partition == {"*": {2: JAN_31}}
    by_topic = parse_timestamps({"startingoffsetsbytimestamp": '{"orders": {"0": "2026-01-31T12:00:00Z"}}'})
    assert by_topic == {"orders": {0: JAN_31}}
    with pytest.raises(SparkOptionError, match="not both"):
        parse_timestamps({"startingtimestamp": millis, "startingoffsetsbytimestamp": '{"0": 1}'})
    with pytest.raises(SparkOptionError, match="neither milliseconds since the epoch nor an ISO 8601 time"):
        parse_timestamps({"startingtimestamp": "yesterday"})
    with pytest.raises(SparkOptionError, match="must be JSON"):
        parse_timestamps({"startingoffsetsbytimestamp": "{}"})
