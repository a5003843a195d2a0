"""payloadSchema's check, value by value (no SparkSession: the types are pyspark's classes)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from django_sqlqueue.spark.payload import PayloadParser, PayloadSchemaMismatch, coerce

LINES = ArrayType(StructType([StructField("sku", StringType()), StructField("qty", IntegerType())]))
ORDER = StructType(
    [
        StructField("id", LongType()),
        StructField("total", DecimalType(10, 2)),
        StructField("paid", BooleanType()),
        StructField("at", TimestampType()),
        StructField(
            "lines", ArrayType(StructType([StructField("sku", StringType()), StructField("qty", IntegerType())]))
        ),
        StructField("attrs", MapType(StringType(), DoubleType())),
    ]
)


def test_values_that_fit_are_converted():
    value = {
        "id": 7,
        "total": "12.50",
        "paid": True,
        "at": "2026-01-02T03:04:05Z",
        "lines": [{"sku": 123, "qty": 2}],
        "attrs": {"w": 1},
        "extra": "ignored",
    }
    out = coerce(value, ORDER)
    assert out["total"] == decimal.Decimal("12.50")
    assert out["at"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert out["lines"] == [{"sku": "123", "qty": 2}]  # a string field takes any value as its JSON text
    assert out["attrs"] == {"w": 1.0}
    assert "extra" not in out
    assert coerce({"id": None}, ORDER)["lines"] is None  # missing and null fields are NULL


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"id": "7"}, "payload.id: expected bigint"),
        ({"id": 2**63}, "payload.id: expected bigint"),
        ({"paid": 1}, "payload.paid: expected boolean"),
        ({"total": "1e20"}, "payload.total: expected decimal(10,2)"),
        ({"at": 5}, "payload.at: expected an ISO 8601 text"),
        ({"lines": [{"qty": 1.5}]}, "payload.lines[0].qty: expected int"),
        ({"attrs": []}, "payload.attrs: expected an object"),
        ([1, 2], "payload: expected an object"),
    ],
)
def test_failfast_names_the_field(value, where):
    parser = PayloadParser(ORDER, "FAILFAST")
    with pytest.raises(PayloadSchemaMismatch, match=r"message id 'x'.*" + re.escape(where)):
        parser.parse(json.dumps(value), lambda: "message id 'x'")


def test_permissive_and_dropmalformed():
    assert PayloadParser(ORDER, "PERMISSIVE").parse('{"id": "no"}', str) == (
        dict.fromkeys(("id", "total", "paid", "at", "lines", "attrs")),
        '{"id": "no"}',
    )
    assert PayloadParser(ORDER, "DROPMALFORMED").parse('{"id": "no"}', str) is None
    assert PayloadParser(IntegerType(), "PERMISSIVE").parse('"x"', str) == (None, '"x"')
