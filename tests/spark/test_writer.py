"""spark/writer.py: which columns a write reads, how Arrow values become JSON, and content ids.

Writes end to end (run twice, retried tasks, bad rows): tests/spark/test_source.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import ArrayType, IntegerType, MapType, StringType, StructField, StructType

from django_sqlqueue.spark.options import SparkOptionError
from django_sqlqueue.spark.writer import Columns, content_id, converter, resolve_columns

ROW = StructType(
    [
        StructField("Payload", StructType([StructField("n", IntegerType())])),
        StructField("order_id", StringType()),
        StructField("key", StringType()),
        StructField("metadata", StringType()),
    ]
)


def test_columns_are_found_by_name_whatever_their_case_and_renamed_by_options() -> None:
    # Spark hands the options over with lower-case names.
    columns, mode = resolve_columns(ROW, {"idcolumn": "order_id"}, need_id=True)
    assert mode == "column"
    assert columns == Columns(
        payload="Payload", payload_is_text=False, key="key", id="order_id", metadata="metadata", metadata_is_text=True
    )
    with pytest.raises(SparkOptionError, match="the DataFrame has no column 'id'"):
        resolve_columns(ROW, {}, need_id=True)
    columns, mode = resolve_columns(ROW, {"idmode": "content"}, need_id=True)  # no id column needed
    assert (mode, columns.id) == ("content", None)
    with pytest.raises(SparkOptionError, match="option 'idMode' must be 'column' or 'content'"):
        resolve_columns(ROW, {"idmode": "random"}, need_id=True)


def test_arrow_maps_become_dicts_at_any_depth_and_plain_values_need_nothing() -> None:
    assert converter(StringType()) is None
    assert converter(StructType([StructField("n", IntegerType())])) is None
    to_json = converter(StructType([StructField("tags", MapType(StringType(), ArrayType(IntegerType())))]))
    assert to_json({"tags": [("a", [1, 2]), ("b", [])]}) == {"tags": {"a": [1, 2], "b": []}}
    nested = converter(ArrayType(MapType(StringType(), MapType(StringType(), IntegerType()))))
    assert nested([[("x", [("y", 1)])], None]) == [{"x": {"y": 1}}, None]


def test_content_ids_are_the_same_for_the_same_message_only() -> None:
    first = content_id("orders", "k1", '{"n":1}')
    assert first == content_id("orders", "k1", '{"n":1}') and first.startswith("c:") and len(first) == 42
    assert len({first, content_id("orders", "k2", '{"n":1}'), content_id("other", "k1", '{"n":1}')}) == 3
    # The parts are separated: moving a character from the key to the payload is another message.
    assert content_id("t", "ab", "c") != content_id("t", "a", "bc")
