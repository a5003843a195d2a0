"""worker/bands.py: a task queue's priority levels in the poll loop's order."""

from __future__ import annotations

from django_sqlqueue.conf import get_settings
from django_sqlqueue.consumers import ConsumerSpec
from django_sqlqueue.worker.bands import BandRound, in_poll_order
from django_sqlqueue.worker.subscription import Subscription


def _sub(topic: str, band: tuple[str, int] | None = None, group: str = "tasks") -> Subscription:
    spec = ConsumerSpec(topic=topic, group=group, handler=lambda message: None, priority_band=band)
    return Subscription.create(spec, "w", get_settings())


def test_levels_of_a_queue_are_polled_together_highest_first_in_place_of_the_first() -> None:
    subs = [
        _sub("orders"),
        _sub("tasks.a.p-10", ("default:a", -10)),
        _sub("events"),
        _sub("tasks.a", ("default:a", 0)),
        _sub("tasks.b", ("default:b", 0)),
        _sub("tasks.a.p50", ("default:a", 50)),
        _sub("tasks.b.p5", ("default:b", 5)),
    ]
    order = [s.topic for s in in_poll_order(subs)]
    assert order == ["orders", "tasks.a.p50", "tasks.a", "tasks.a.p-10", "events", "tasks.b.p5", "tasks.b"]


def test_a_round_skips_the_lower_levels_of_a_queue_once_a_higher_one_delivered() -> None:
    high, low = _sub("tasks.a.p50", ("default:a", 50)), _sub("tasks.a", ("default:a", 0))
    other, plain = _sub("tasks.b", ("default:b", 0)), _sub("orders")
    empty_round = BandRound()
    empty_round.polled(high, 0)  # nothing to deliver (empty, or its partitions busy)
    assert not empty_round.skips(low)
    busy_round = BandRound()
    busy_round.polled(high, 3)
    assert busy_round.skips(low)
    assert not busy_round.skips(other) and not busy_round.skips(plain)  # other queues, plain consumers
    busy_round.polled(plain, 5)
    assert not BandRound().skips(low)  # each round starts afresh


def test_the_same_queue_name_in_another_group_is_another_queue() -> None:
    mine, theirs = _sub("tasks.a", ("default:a", 0)), _sub("tasks.a", ("default:a", 0), group="other")
    rnd = BandRound()
    rnd.polled(_sub("tasks.a.p5", ("default:a", 5)), 1)
    assert rnd.skips(mine) and not rnd.skips(theirs)
