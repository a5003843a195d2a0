"""spark/schema.py: the columns of a read, as a DDL string Spark parses in the JVM."""

from __future__ import annotations

import pytest

from django_sqlqueue.spark.schema import COLUMN_NAMES, MESSAGE_COLUMNS, message_schema

from .helpers import publish_sequenced, reader

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_ddl_names_every_column_in_order_and_types_the_payload_when_asked() -> None:
    assert message_schema().split(", ")[:3] == ["`topic` string", "`partition` bigint", "`offset` bigint"]
    typed = message_schema("struct<n:int>", "_corrupt")
    assert "`payload` struct<n:int>" in typed and typed.endswith(", `_corrupt` string")
    assert tuple(name for name, _ in MESSAGE_COLUMNS) == COLUMN_NAMES


def test_a_read_has_exactly_these_columns_and_spark_parses_the_ddl(spark, queue_options) -> None:
    publish_sequenced("schema.t", 3)
    frame = reader(spark, queue_options, "schema.t")
    assert tuple(frame.columns) == COLUMN_NAMES
    assert [f.dataType.simpleString() for f in frame.schema.fields] == [t for _, t in MESSAGE_COLUMNS]
    parsed = spark.createDataFrame([], message_schema("struct<n:int>", "_corrupt"))
    assert parsed.columns == [*COLUMN_NAMES, "_corrupt"]
    assert parsed.schema["payload"].dataType.simpleString() == "struct<n:int>"
