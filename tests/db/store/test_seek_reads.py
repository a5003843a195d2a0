"""store/seek_reads.py: the first offset of a partition, by position and by time.

By time the answer must equal the brute-force one (the smallest offset whose ``published_at``
is at or after the time) wherever offsets and ``published_at`` disagree by less than
``TIME_SLACK`` -- transactions that stayed open, offsets garbage-collected below and between --
and the probes must be logarithmic in the partition's offsets. ``WALK`` is lowered so a few
thousand rows take many probes; so is ``SEQ_GAP``.
"""

from __future__ import annotations

import datetime as dt
import random

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_sqlqueue.db.store import seek_reads
from django_sqlqueue.models import Message

from ...support.engine_helpers import store
from ...support.factories import MessageFactory

pytestmark = pytest.mark.django_db

T, P = "seekreads", 2
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
N = 2_000
#: Rows' seqs from here (the sequence's own values stay far below).
SEQ0 = 10**9


@pytest.fixture(autouse=True)
def small_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seek_reads, "WALK", 8)
    monkeypatch.setattr(seek_reads, "SEQ_GAP", 8)


def fill(published: dict[int, dt.datetime], jitter: dict[int, float] | None = None) -> None:
    """One partition's messages: offset -> published_at (another partition around it).

    ``seq`` follows ``published_at`` (a row's seq and time are both taken as it is written),
    ``jitter`` moving a row's place in seq order by that many seconds (INSERT statements
    that ran concurrently); the offsets are the commit order, given.
    """
    jitter = jitter or {}
    order = sorted(published, key=lambda o: (published[o] + dt.timedelta(seconds=jitter.get(o, 0)), o))
    seqs = {o: SEQ0 + i for i, o in enumerate(order)}
    rows = [
        MessageFactory.build(topic=T, partition=P, offset=o, published_at=at, seq=seqs[o])
        for o, at in published.items()
    ]
    rows += [
        MessageFactory.build(topic=T, partition=P + 1, offset=o, published_at=BASE, seq=SEQ0 - 100 + o)
        for o in range(1, 50)
    ]
    Message.objects.bulk_create(rows, batch_size=500)


def brute_force(published: dict[int, dt.datetime], since: dt.datetime) -> int | None:
    return min((o for o, at in published.items() if at >= since), default=None)


def times(published: dict[int, dt.datetime]) -> list[dt.datetime]:
    """Times to ask for: before the first, after the last, exact and between, random."""
    rng = random.Random(7)
    stamps = sorted(published.values())
    asked = [stamps[0] - dt.timedelta(days=1), stamps[-1] + dt.timedelta(seconds=1), stamps[0], stamps[-1]]
    asked += [rng.choice(stamps) for _ in range(15)]
    asked += [rng.choice(stamps) + dt.timedelta(milliseconds=500) for _ in range(15)]
    return asked


def check(published: dict[int, dt.datetime], jitter: dict[int, float] | None = None) -> None:
    fill(published, jitter)
    s = store()
    for since in times(published):
        assert s.first_offset(T, P, since) == brute_force(published, since), since
    assert s.first_offset(T, P) == min(published)


def test_in_order_a_minute_apart() -> None:
    check({o: BASE + dt.timedelta(minutes=o) for o in range(1, N + 1)})


def test_out_of_order_within_the_slack() -> None:
    # Transactions open up to 50 minutes: a message numbered later than others bears an
    # earlier time, by less than TIME_SLACK (an hour).
    rng = random.Random(3)
    check({o: BASE + dt.timedelta(seconds=10 * o - rng.randrange(0, 3_000)) for o in range(1, N + 1)})


def test_seq_order_out_by_less_than_its_slack() -> None:
    # INSERT statements that ran side by side: a row written later got a smaller seq, by less
    # than SEQ_SLACK (a minute).
    rng = random.Random(5)
    published = {o: BASE + dt.timedelta(seconds=10 * o) for o in range(1, N + 1)}
    check(published, {o: rng.uniform(-40, 40) for o in published})


def test_offsets_collected_below_and_between() -> None:
    kept = [o for o in range(500, 3_000) if not 1_200 <= o < 1_900]  # GC'd prefix, a hole
    check({o: BASE + dt.timedelta(seconds=30 * o) for o in kept})


def test_many_messages_of_one_time() -> None:
    # A bulk load: many rows of one statement bear one time.
    check({o: BASE + dt.timedelta(hours=o // 500) for o in range(1, N + 1)})


def test_empty_partition() -> None:
    assert store().first_offset(T, P, BASE) is None
    assert store().first_offset(T, P) is None


def test_probes_are_logarithmic_and_the_read_forward_short() -> None:
    published = {o: BASE + dt.timedelta(minutes=o) for o in range(1, N + 1)}
    fill(published)
    since = BASE + dt.timedelta(minutes=1_500, seconds=1)
    with CaptureQueriesContext(connection) as queries:
        assert store().first_offset(T, P, since) == 1_501
    # Per search the first and last entries, then halving down to 8 positions (WALK, SEQ_GAP):
    # 2,000 offsets in 8 probes, 2,049 seqs (with the other partition's) in 9. Then the read.
    assert len(queries) <= (2 + 9) + (2 + 10) + 1, [q["sql"] for q in queries]
    # The read forward starts less than WALK offsets below the last message published
    # before since - TIME_SLACK (offset 1,440: an hour of messages a minute apart).
    s = store()
    found = s._search(lambda at, last: s._probe_offset(T, P, at, last), since - seek_reads.TIME_SLACK, 8)
    assert found is not None and found[1] and 1_440 - 8 <= found[0] <= 1_440, found


def test_counts_a_range_exactly_up_to_the_cap_and_gives_longer_ones_as_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(seek_reads, "COUNT_CAP", 100)
    kept = [o for o in range(201, 1_001) if not 400 <= o < 450]  # collected below 201; a hole
    fill({o: BASE + dt.timedelta(seconds=o) for o in kept})
    s = store()
    assert s.count_messages(T, P, 420, 500) == (51, True)  # in the cap: counted, hole and all
    assert s.count_messages(T, P, 0, 290) == (90, True)  # the retained part is in the cap
    assert s.count_messages(T, P, 300, 1_000) == (700, False)  # the offsets: an upper bound
    assert s.count_messages(T, P, 2_000, 5_000) == (0, True)  # above the head
    assert s.count_messages(T, P + 5, 0, 5_000) == (0, True)  # an empty partition


def test_naive_and_year_one_times() -> None:
    published = {o: BASE + dt.timedelta(minutes=o) for o in range(1, 200)}
    fill(published)
    s = store()
    since = BASE + dt.timedelta(minutes=100)
    assert s.first_offset(T, P, since.replace(tzinfo=None)) == s.first_offset(T, P, since) == 100  # naive = UTC
    assert s.first_offset(T, P, dt.datetime(1, 1, 1, tzinfo=dt.UTC)) == 1  # no OverflowError


def test_the_seq_search_runs_once_per_store_topic_and_time() -> None:
    fill({o: BASE + dt.timedelta(minutes=o) for o in range(1, N + 1)})
    s, since = store(), BASE + dt.timedelta(minutes=1_000)
    with CaptureQueriesContext(connection) as first:
        s.first_offset(T, P, since)
    with CaptureQueriesContext(connection) as second:
        s.first_offset(T, P + 1, since)
    seq_probes = [q for q in first if "seq, published_at" in q["sql"]]
    assert bool(seq_probes) == (connection.vendor != "postgresql")  # PostgreSQL has no seq search
    assert not [q for q in second if "seq, published_at" in q["sql"]]
