"""db/dialects/json_search.py: typed, exact comparison of a payload field on each database.

Django's own key lookups fail this matrix on MySQL/MariaDB (``42`` matches ``"42"`` and
misses ``42.0``) and on SQLite (``true`` matches ``"true"``): every database must pass it here.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from django_sqlqueue import publish_many
from django_sqlqueue.db.dialects.json_search import OctetLength, payload_match
from django_sqlqueue.models import Message

pytestmark = pytest.mark.django_db

STORED = [42, "42", 42.0, 42.5, True, "true", None, "null", "abc", "ABC", "café", 'x"y', "", 0, False, -7]
STORED += [{"b": 1}, [1], 2**63 - 1, 1e20, 0.1]


def same(a: object, b: object) -> bool:
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, numbers) and isinstance(b, numbers):
        return a == b
    return type(a) is type(b) and a == b


def matching(path: tuple[str, ...], value: object) -> list[str]:
    qn = connection.ops.quote_name
    sql, params = payload_match(connection, f"{qn('queue_messages')}.{qn('payload')}", path, value)  # type: ignore[arg-type]
    condition = RawSQL(sql, params, output_field=BooleanField())
    return sorted(Message.objects.filter(topic="t").filter(condition).values_list("id", flat=True))


@pytest.mark.parametrize(
    "value", [42, "42", 42.5, True, "true", None, "null", "abc", "café", 'x"y', "", 0, False, -7, 2**63 - 1, 1e20, 0.1]
)
def test_a_field_matches_only_equal_values_of_its_json_type(value):
    publish_many("t", [{"payload": {"a": v}, "id": f"i{i}"} for i, v in enumerate(STORED)])
    publish_many(
        "t", [{"payload": {"z": 1}, "id": "missing"}, {"payload": [1, 2], "id": "list"}, {"payload": "s", "id": "s"}]
    )
    want = sorted(f"i{i}" for i, v in enumerate(STORED) if same(v, value))
    assert matching(("a",), value) == want


def test_a_nested_field():
    publish_many("t", [{"payload": {"c": {"d": "x"}}, "id": "n"}, {"payload": {"c": "x"}, "id": "flat"}])
    assert matching(("c", "d"), "x") == ["n"] and matching(("c",), "x") == ["flat"]


def test_octet_length_is_the_stored_size_in_bytes():
    publish_many("t", [{"payload": {"a": "é" * 10}, "id": "e"}])
    size = Message.objects.filter(topic="t").annotate(n=OctetLength("payload")).values_list("n", flat=True).get()
    compact = len(json.dumps({"a": "é" * 10}, separators=(",", ":"), ensure_ascii=False).encode())
    assert compact <= size <= compact + 2  # PostgreSQL's jsonb text has a space after ':'
