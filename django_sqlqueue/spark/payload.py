"""``payloadSchema``: the payload parsed into a Spark type, with Spark's parse modes.

A read with ``payloadSchema`` returns ``payload`` as that type. A payload that does not
fit it (a string where the schema has an int, a list where it has a struct) is handled
by option ``mode``, as Spark's ``from_json`` and JSON reader do:

- ``PERMISSIVE`` (the default): the payload's fields are NULL and the raw payload (its
  JSON text) goes to the column ``columnNameOfCorruptRecord`` (default
  ``_corrupt_record``), which is NULL for payloads that fit;
- ``DROPMALFORMED``: the message is left out of the result;
- ``FAILFAST``: the read fails with :class:`PayloadSchemaMismatch`, naming the message id,
  its topic, partition and offset, and what did not fit.

The check runs in Python, field by field, before Spark converts the row (a bare Arrow
conversion error would name neither the message nor the option).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Callable
from typing import Any

from ..exceptions import SQLQueueError
from ..rules.timeparse import parse_time
from .options import SparkOptionError

MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
DEFAULT_CORRUPT_COLUMN = "_corrupt_record"

_INT_RANGES = {
    "ByteType": 2**7,
    "ShortType": 2**15,
    "IntegerType": 2**31,
    "LongType": 2**63,
}


class PayloadSchemaMismatch(SQLQueueError):
    """A message's payload does not fit the read's ``payloadSchema`` (``mode=FAILFAST``)."""


class _Misfit(Exception):
    """Internal: where and why a value does not fit."""


def parse_mode(value: str) -> str:
    """Return the upper-cased ``mode`` option, or raise naming the valid ones."""
    mode = (value or "PERMISSIVE").strip().upper()
    if mode not in MODES:
        raise SparkOptionError(f"option 'mode' must be one of {', '.join(MODES)}, got {value!r}.")
    return mode


def _fail(path: str, expected: str, value: Any) -> _Misfit:
    shown = json.dumps(value, default=str)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return _Misfit(f"{path}: expected {expected}, got {type(value).__name__} {shown}")


def coerce(value: Any, data_type: Any, path: str = "payload") -> Any:
    """Return the decoded JSON ``value`` as Spark's converter wants ``data_type``; raise ``_Misfit``."""
    if value is None:
        return None
    kind = type(data_type).__name__
    if kind == "StructType":
        if not isinstance(value, dict):
            raise _fail(path, "an object", value)
        return {f.name: coerce(value.get(f.name), f.dataType, f"{path}.{f.name}") for f in data_type.fields}
    if kind == "ArrayType":
        if not isinstance(value, list):
            raise _fail(path, "an array", value)
        return [coerce(v, data_type.elementType, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "MapType":
        if not isinstance(value, dict):
            raise _fail(path, "an object", value)
        return {k: coerce(v, data_type.valueType, f"{path}.{k}") for k, v in value.items()}
    if kind == "StringType":
        # As Spark's JSON parser: a non-string value becomes its JSON text.
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if kind in _INT_RANGES:
        bound = _INT_RANGES[kind]
        if not isinstance(value, int) or isinstance(value, bool) or not -bound <= value < bound:
            raise _fail(path, data_type.simpleString(), value)
        return value
    if kind in ("DoubleType", "FloatType"):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _fail(path, data_type.simpleString(), value)
        return float(value)
    if kind == "DecimalType":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise _fail(path, data_type.simpleString(), value)
        try:
            number = decimal.Decimal(str(value))
        except decimal.InvalidOperation:
            raise _fail(path, data_type.simpleString(), value) from None
        # Digits before the point must fit precision - scale (Spark would overflow to NULL).
        if not number.is_finite() or (number and number.adjusted() + 1 > data_type.precision - data_type.scale):
            raise _fail(path, data_type.simpleString(), value)
        return number
    if kind == "BooleanType":
        if not isinstance(value, bool):
            raise _fail(path, "boolean", value)
        return value
    if kind in ("TimestampType", "TimestampNTZType", "DateType"):
        if not isinstance(value, str):
            raise _fail(path, "an ISO 8601 text", value)
        try:
            moment = parse_time(value)
        except ValueError:
            raise _fail(path, "an ISO 8601 text", value) from None
        if kind == "DateType":
            return moment.date()
        return moment if kind == "TimestampType" else moment.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def null_of(data_type: Any) -> Any:
    """The value of a payload that did not fit: a struct of NULL fields, else NULL."""
    if type(data_type).__name__ == "StructType":
        return {f.name: None for f in data_type.fields}
    return None


class PayloadParser:
    """Parses payloads of one read into ``data_type`` under a mode (see the module docstring)."""

    def __init__(self, data_type: Any, mode: str) -> None:
        self.data_type = data_type
        self.mode = mode

    def parse(self, text: str, where: Callable[[], str]) -> tuple[Any, str | None] | None:
        """Return (payload, corrupt record text or None); None drops the message (DROPMALFORMED)."""
        try:
            return coerce(json.loads(text), self.data_type), None
        except _Misfit as misfit:
            if self.mode == "FAILFAST":
                raise PayloadSchemaMismatch(
                    f"{where()}: the payload does not fit option payloadSchema "
                    f"({self.data_type.simpleString()}): {misfit} (mode=FAILFAST; mode=PERMISSIVE puts such "
                    "payloads in the corrupt-record column)."
                ) from None
            if self.mode == "DROPMALFORMED":
                return None
            return null_of(self.data_type), text
