"""DeliveryStore (``store/delivery.py``): the poll's state query, the fetch and recording
deliveries, against real rows and the database clock."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test import override_settings

from django_sqlqueue import publish, publish_many
from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.store import FetchPlan
from django_sqlqueue.db.store.delivery import decode_columns
from django_sqlqueue.models import DeliveryState, Message
from django_sqlqueue.rules.dlq import UNDECODABLE_KEY

from ...support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    SCHEDULED,
    db_now,
    execute,
    fetch_due,
    fetch_fresh,
    key_for_partition,
    now_minus,
    offset_of,
    publish_to,
    row,
    sequence,
    store,
)
from ...support.poison import HUGE_INTEGER, store_invalid, store_raw
from .helpers import A, B, G, T, deliver, fill, leased

pytestmark = pytest.mark.django_db(transaction=True)


# -- fetching --------------------------------------------------------------------------


def test_fetch_returns_fresh_and_due_messages():
    published = fill(A, 5)
    publish(T, {"other": True}, key=key_for_partition(B), id="b-1", metadata={"m": 1})
    sequence(T)
    s = store()
    s.ensure_offsets(G, T, [A, B])
    deliver(A, [1, 2, 3])
    s.nack(G, T, "w1", [(A, 2, 0), (A, 3, 60)])  # 2 due now, 3 in a minute

    got = s.fetch(G, T, [FetchPlan(A, 3, True), FetchPlan(B, 0, False)], 10)
    by_pos = {(m.partition, m.offset): m for m in got}
    assert sorted(by_pos) == [(A, 2), (A, 4), (A, 5), (B, 1)]
    due = by_pos[(A, 2)]
    assert (due.retry_count, due.status) == (0, RETRY)
    assert all(by_pos[k].retry_count is None and by_pos[k].status is None for k in [(A, 4), (A, 5), (B, 1)])
    stored = Message.objects.get(topic=T, partition=A, offset=4)
    m4 = by_pos[(A, 4)]
    assert (m4.id, m4.key, m4.payload, m4.metadata) == (
        published[3].id,
        key_for_partition(A),
        {"p": A, "i": 4},
        {},
    )
    assert (m4.created_at, m4.deliver_at) == (stored.created_at, stored.deliver_at)
    b1 = by_pos[(B, 1)]
    assert (b1.id, b1.key, b1.payload, b1.metadata) == ("b-1", key_for_partition(B), {"other": True}, {"m": 1})

    assert [m.offset for m in s.fetch(G, T, [FetchPlan(A, 3, False)], 1)] == [4]  # limit per branch
    assert [m.offset for m in s.fetch(G, T, [FetchPlan(A, None, True)], 10)] == [2]
    assert s.fetch(G, T, [FetchPlan(A, 5, False)], 10) == []
    # Another group's delivery rows are not this group's due messages.
    assert s.fetch("analytics", T, [FetchPlan(A, None, True)], 10) == []


def test_fetch_never_returns_unsequenced_messages():
    fill(A, 2)
    publish_to(T, A, 3, seq=False)
    assert [m.offset for m in fetch_fresh(G, T, A)] == [1, 2]
    sequence(T)
    assert [m.offset for m in fetch_fresh(G, T, A)] == [1, 2, 3, 4, 5]


def test_fetch_is_not_blocked_by_a_nacked_message_with_many_rows_behind_it():
    """The RFC's ``offset > watermark LIMIT n`` would return only offsets 1..10 here,
    none of them deliverable, and the partition would stall behind the nack."""
    fill(A, 40)
    s = store()
    leased(A)
    s.ensure_offsets(G, T, [A])
    deliver(A, list(range(1, 27)))
    s.nack(G, T, "w1", [(A, 1, 0)])  # watermark+1 waits for its retry, due now
    s.ack(G, T, "w1", [(A, off) for off in range(2, 14)])  # 12 acked rows behind it
    # ... and 13 in flight (14..26): 25 rows between the nack and the fresh messages.
    (st,) = s.poll_state(G, T, "w1", 30)
    assert (st.watermark, st.delivered_max, st.in_flight, st.advanceable) == (
        0,
        26,
        13,
        False,
    )
    assert st.next_due <= st.now
    plan = FetchPlan(A, max(st.watermark, st.delivered_max), True)
    got = s.fetch(G, T, [plan], 10)
    assert sorted(m.offset for m in got) == [1, *range(27, 37)]
    assert [m.retry_count for m in got if m.offset == 1] == [0]


def test_fetch_spans_more_partitions_than_one_statement_holds():
    from django_sqlqueue.db.store import FETCH_CHUNK

    n = FETCH_CHUNK + 30
    with override_settings(SQLQUEUE={"TOPICS": {T: {"partitions": n}}}):
        publish_many(
            T,
            [{"payload": p, "key": key_for_partition(p, n)} for p in range(n) for _ in range(2)],
        )
    sequence(T)
    got = store().fetch(G, T, [FetchPlan(p, 0, True) for p in range(n)], 1)
    assert sorted((m.partition, m.offset) for m in got) == [(p, 1) for p in range(n)]
    assert all(m.payload == m.partition for m in got)


# -- recording deliveries --------------------------------------------------------------


def test_mark_delivered_fresh_redelivered_and_parked():
    fill(A, 3)
    delayed = publish(T, "later", key=key_for_partition(A), delay=3600)
    sequence(T)
    later = offset_of(T, delayed.id)
    assert later == 4
    s = store()
    leased(A)
    s.ensure_offsets(G, T, [A])
    fetched = {m.offset: m for m in fetch_fresh(G, T, A)}
    before = db_now()
    assert s.mark_delivered(G, T, "w1", [fetched[1], fetched[2], fetched[3]], [], [fetched[later]], 30) == {A}
    after = db_now()
    for off in (1, 2, 3):
        r = row(G, T, A, off)
        assert (r.status, r.retry_count, r.acked) == (IN_FLIGHT, 0, False)
        assert before + dt.timedelta(seconds=30) <= r.invisible_until <= after + dt.timedelta(seconds=30)
    parked = row(G, T, A, later)
    assert (parked.status, parked.retry_count, parked.acked) == (SCHEDULED, 0, False)
    assert parked.invisible_until == Message.objects.get(topic=T, partition=A, offset=4).deliver_at

    # 1 is nacked, 2's visibility expires, the parked 4 comes due (data, not the clock).
    s.nack(G, T, "w1", [(A, 1, 0)])
    ago, ago_params = now_minus(1)
    where = "message_offset IN (2, 4)"
    assert execute(f"UPDATE queue_delivery_state SET invisible_until = {ago} WHERE {where}", ago_params) == 2
    due = {m.offset: m for m in fetch_due(G, T, A)}
    assert sorted(due) == [1, 2, 4]
    before = db_now()
    s.mark_delivered(G, T, "w1", [], list(due.values()), [], 10)
    after = db_now()
    counts = {off: row(G, T, A, off).retry_count for off in (1, 2, 3, 4)}
    # A nacked or expired delivery counts a retry; a parked message's first delivery does not.
    assert counts == {1: 1, 2: 1, 3: 0, 4: 0}
    for off in (1, 2, 4):
        r = row(G, T, A, off)
        assert r.status == IN_FLIGHT
        assert before + dt.timedelta(seconds=10) <= r.invisible_until <= after + dt.timedelta(seconds=10)
    assert DeliveryState.objects.count() == 4


def test_mark_delivered_leaves_an_existing_row_alone():
    fill(A, 2)
    s = store()
    leased(A)
    (m1, m2) = fetch_fresh(G, T, A)
    s.mark_delivered(G, T, "w1", [m1], [], [], 60)
    s.nack(G, T, "w1", [(A, 1, 120)])
    # A racing former lease holder delivers 1 again as fresh: the row keeps its state.
    s.mark_delivered(G, T, "w1", [m1, m2], [], [], 5)
    r1 = row(G, T, A, 1)
    assert (r1.status, r1.retry_count) == (RETRY, 0)
    assert r1.invisible_until > db_now() + dt.timedelta(seconds=100)
    assert row(G, T, A, 2).status == IN_FLIGHT


def test_mark_delivered_redelivery_skips_acked_rows():
    fill(A, 1)
    s = store()
    leased(A)
    (m1,) = fetch_fresh(G, T, A)
    s.mark_delivered(G, T, "w1", [m1], [], [], 60)
    s.nack(G, T, "w1", [(A, 1, 0)])
    (due,) = fetch_due(G, T, A)
    s.ack(G, T, "w1", [(A, 1)])  # acked meanwhile
    s.mark_delivered(G, T, "w1", [], [due], [], 60)
    r = row(G, T, A, 1)
    assert r.acked and r.retry_count == 0 and r.status == RETRY


def test_release_deliveries_restores_retry_count_and_makes_them_due():
    fill(A, 3)
    s = store()
    leased(A)
    fetched = fetch_fresh(G, T, A)
    s.mark_delivered(G, T, "w1", fetched, [], [], 60)
    s.nack(G, T, "w1", [(A, 2, 0)])
    (due,) = fetch_due(G, T, A)
    s.mark_delivered(G, T, "w1", [], [due], [], 60)  # 2 is on its second attempt
    assert row(G, T, A, 2).retry_count == 1
    s.nack(G, T, "w1", [(A, 3, 60)])  # 3 waits for a retry: not in flight, left alone

    s.release_deliveries(G, T, "w1", [(A, 1), (A, 2), (A, 3)])
    now = db_now()
    r1, r2, r3 = (row(G, T, A, off) for off in (1, 2, 3))
    assert (r1.status, r1.retry_count) == (SCHEDULED, 0)  # never really delivered: attempt 1 again
    assert (r2.status, r2.retry_count) == (RETRY, 0)  # the second attempt is given back
    assert r1.invisible_until <= now and r2.invisible_until <= now
    assert (r3.status, r3.retry_count) == (RETRY, 0) and r3.invisible_until > now + dt.timedelta(seconds=50)
    # Redelivered after the release, they come back with the same attempt numbers.
    again = {m.offset: m for m in fetch_due(G, T, A)}
    assert sorted(again) == [1, 2]
    s.mark_delivered(G, T, "w1", [], list(again.values()), [], 60)
    assert row(G, T, A, 1).retry_count == 0 and row(G, T, A, 2).retry_count == 1
    s.release_deliveries(G, T, "w1", [])  # nothing to do


# -- rows that cannot be decoded ----------------------------------------------------------


def _poisoned(column: str, text: str, *, invalid: bool) -> list:
    """Three messages of partition A, the second with ``text`` stored raw in ``column``; fetch them."""
    published = fill(A, 3)
    (store_invalid if invalid else store_raw)(T, published[1].id, column, text)
    return fetch_fresh(G, T, A)


@pytest.mark.parametrize(
    ("column", "text", "invalid", "error"),
    [
        ("payload", "{not json", True, "payload could not be decoded as JSON (JSONDecodeError: Expecting"),
        ("metadata", "]", True, "metadata could not be decoded as JSON (JSONDecodeError: Expecting"),
        ("payload", HUGE_INTEGER, False, "payload could not be decoded as JSON (ValueError: Exceeds the limit"),
        ("metadata", "[1, 2]", False, "metadata is not a JSON object (a JSON array)"),
        ("metadata", "null", False, "metadata is not a JSON object (a JSON null)"),
    ],
)
def test_fetch_decodes_each_row_on_its_own(column, text, invalid, error):
    """A row that cannot be decoded does not fail the fetch: it comes back marked, with the
    column's stored text kept for its dead letter; the other rows are decoded as usual."""
    first, poison, third = _poisoned(column, text, invalid=invalid)
    assert first.undecodable is None and third.undecodable is None
    assert (first.payload, third.payload) == ({"p": A, "i": 1}, {"p": A, "i": 3})
    assert poison.offset == 2 and poison.undecodable is not None
    assert poison.undecodable.startswith(f"undecodable row: {error}"), poison.undecodable
    kept = getattr(poison, column)
    assert list(kept) == [UNDECODABLE_KEY]
    # The stored text (PostgreSQL's jsonb normalizes spacing).
    assert kept[UNDECODABLE_KEY].replace(" ", "") == text.replace(" ", "")


def test_decode_columns_names_every_column_that_failed():
    d = get_dialect(connection)
    payload, metadata, error = decode_columns(d, "{", "[]")
    assert payload == {UNDECODABLE_KEY: "{"} and metadata == {UNDECODABLE_KEY: "[]"}
    assert error is not None and "payload could not be decoded" in error and "metadata is not a JSON object" in error
    assert decode_columns(d, '{"a": 1}', "{}") == ({"a": 1}, {}, None)
    assert decode_columns(d, b"\xff", "{}")[0] == {UNDECODABLE_KEY: "\ufffd"}  # bytes that are not UTF-8
