"""payloadSchema with a mode: PERMISSIVE (NULL fields and the raw payload in a column),
DROPMALFORMED, and FAILFAST (an error naming the message). Before, one bad payload failed the
whole read with a bare pyarrow ArrowInvalid."""

from __future__ import annotations

import pytest

from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.models import Message
from django_sqlqueue.publisher import publish_many

from .helpers import reader

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = "struct<n: int, tags: array<string>>"


def _publish() -> None:
    publish_many(
        "typed",
        [
            {"payload": {"n": 1, "tags": ["a"]}, "key": "k", "id": "good1"},
            {"payload": {"n": "not a number"}, "key": "k", "id": "bad"},
            {"payload": {"n": 3}, "key": "k", "id": "good3"},
        ],
    )
    sequence("typed")


def test_permissive_is_the_default_nulls_and_the_raw_payload(spark, queue_options):
    _publish()
    rows = {r.id: r for r in reader(spark, queue_options, "typed", payloadSchema=SCHEMA).collect()}
    assert rows["good1"].payload.n == 1 and rows["good1"].payload.tags == ["a"]
    assert rows["good1"]._corrupt_record is None
    assert rows["bad"].payload.n is None and rows["bad"].payload.tags is None
    assert rows["bad"]._corrupt_record.replace(" ", "") == '{"n":"notanumber"}'
    named = reader(spark, queue_options, "typed", payloadSchema=SCHEMA, columnNameOfCorruptRecord="raw").collect()
    assert [r.raw for r in named if r.id == "bad"] == [rows["bad"]._corrupt_record]


def test_failfast_names_the_message(spark, queue_options):
    _publish()
    bad = Message.objects.get(topic="typed", id="bad")
    with pytest.raises(Exception) as info:
        reader(spark, queue_options, "typed", payloadSchema=SCHEMA, mode="FAILFAST").collect()
    text = str(info.value)
    assert "PayloadSchemaMismatch" in text and "ArrowInvalid" not in text
    assert f"message id 'bad' (topic 'typed', partition {bad.partition}, offset {bad.offset})" in text
    assert "payload.n: expected int, got str" in text and "payloadSchema" in text


def test_dropmalformed_and_a_bad_mode(spark, queue_options):
    _publish()
    df = reader(spark, queue_options, "typed", payloadSchema=SCHEMA, mode="dropmalformed")
    assert "_corrupt_record" not in df.columns
    assert sorted(r.id for r in df.collect()) == ["good1", "good3"]
    with pytest.raises(Exception, match="option 'mode' must be one of PERMISSIVE, DROPMALFORMED, FAILFAST"):
        reader(spark, queue_options, "typed", payloadSchema=SCHEMA, mode="LENIENT").collect()
