"""ops/previews.py: the start of a JSON column cut by the database, and its compact text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_sqlqueue import publish_many
from django_sqlqueue.models import Message
from django_sqlqueue.ops.previews import LIST_PREVIEW_LENGTH, Cut, compact_json, cut_columns, read_cut

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=' "\\{}[],:\t\nab'),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@given(JSON, st.integers(0, 300))
def test_compact_json_drops_whitespace_outside_strings_only(value, cut):
    spaced, compact = json.dumps(value, indent=1), json.dumps(value, separators=(",", ":"))
    assert compact_json(spaced) == compact and compact_json(compact) == compact
    # The start of a value compacts to the start of the compact value.
    assert compact.startswith(compact_json(spaced[:cut]))


@pytest.mark.django_db
def test_cut_columns_send_the_start_the_length_and_the_size():
    publish_many("t", [{"payload": {"a": "x" * 500}, "id": "big"}, {"payload": {"a": 1}, "id": "small"}])
    rows = Message.objects.filter(topic="t").defer("payload").annotate(**cut_columns("payload", "p", size=True))
    got = {m.id: read_cut(m, "p", compact=True) for m in rows.order_by("seq")}
    assert got["small"] == Cut('{"a":1}', 7, 7) and not got["small"].cut
    big = got["big"]
    assert big.cut and big.text.startswith('{"a":"xxx') and len(big.text) <= LIST_PREVIEW_LENGTH
    assert big.length >= 508 and big.size is not None and big.size >= 508
