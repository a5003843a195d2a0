"""The poll loop's cadence (django_sqlqueue/worker/cadence.py): pure arithmetic on a clock."""

from __future__ import annotations

import pytest

from django_sqlqueue.worker.cadence import Cadence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def looks(cadence: Cadence, clock: Clock, rounds: int) -> list[float]:
    """The waits of ``rounds`` empty rounds in a row, advancing the clock by each."""
    waits = []
    for _ in range(rounds):
        wait = cadence.after_round(delivered=False, more=False)
        waits.append(round(wait, 6))
        clock.now += wait
    return waits


def test_a_round_that_delivered_or_left_more_is_followed_at_once():
    clock = Clock()
    cadence = Cadence(0.1, 1.0, clock=clock)
    assert cadence.after_round(delivered=True, more=False) == 0
    assert cadence.after_round(delivered=False, more=True) == 0


def test_empty_rounds_back_off_from_an_eighth_of_the_interval_doubling_to_the_max():
    clock = Clock()
    cadence = Cadence(0.1, 1.0, clock=clock)
    cadence.after_round(delivered=True, more=False)
    # Looks at 12.5, 25, 50, 100, 200, 400, 800 ms after the work, then every second.
    assert looks(cadence, clock, 9) == pytest.approx([0.0125, 0.0125, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0])


def test_new_work_resets_the_backoff():
    clock = Clock()
    cadence = Cadence(0.1, 1.0, clock=clock)
    looks(cadence, clock, 12)
    assert cadence.after_round(delivered=True, more=False) == 0
    assert looks(cadence, clock, 2) == pytest.approx([0.0125, 0.0125])


def test_an_idle_worker_costs_one_look_per_max_interval():
    clock = Clock()
    cadence = Cadence(0.1, 1.0, clock=clock)
    looks(cadence, clock, 20)
    waits = looks(cadence, clock, 60)
    assert waits == [1.0] * 60  # 60 s idle: 60 polls


@pytest.mark.parametrize(("interval", "maximum"), [(0.01, 0.05), (0.1, 0.1), (2.0, 30.0)])
def test_waits_stay_within_an_eighth_of_the_interval_and_the_max(interval, maximum):
    clock = Clock()
    cadence = Cadence(interval, maximum, clock=clock)
    waits = looks(cadence, clock, 40)
    assert min(waits) == pytest.approx(interval / 8)
    assert max(waits) == pytest.approx(maximum)


def test_while_notifications_announce_new_messages_the_short_looks_are_skipped():
    clock = Clock()
    cadence = Cadence(0.5, 5.0, clock=clock)
    cadence.pushed = True
    cadence.after_round(delivered=True, more=False)
    assert looks(cadence, clock, 6) == [0.5, 0.5, 1.0, 2.0, 4.0, 5.0]


def test_with_notifications_a_delivery_is_not_followed_by_a_poll_that_would_find_nothing():
    """A message that arrives during the batch sends its own notification, which wakes the
    loop from this wait at once; only a full batch (more is waiting) polls again at once."""
    clock = Clock()
    cadence = Cadence(0.1, 1.0, clock=clock)
    cadence.pushed = True
    assert cadence.after_round(delivered=True, more=False) == pytest.approx(0.1)
    assert cadence.after_round(delivered=True, more=True) == 0
    assert cadence.after_round(delivered=False, more=True) == 0
    cadence.pushed = False  # the listener lost its connection: polling chains again
    assert cadence.after_round(delivered=True, more=False) == 0


def test_right_after_work_the_rounds_are_looks_until_an_interval_has_passed():
    clock = Clock()
    cadence = Cadence(0.1, 1.0, clock=clock)
    cadence.after_round(delivered=True, more=False)
    assert cadence.full_poll_due(woken=False)  # the round after work is a full poll
    kinds = []
    for _ in range(6):
        clock.now += cadence.after_round(delivered=False, more=False)
        kinds.append("full" if cadence.full_poll_due(woken=False) else "look")
    # At 12.5, 25 and 50 ms: looks; from 100 ms on: full polls (the old schedule).
    assert kinds == ["look", "look", "look", "full", "full", "full"]


def test_a_wake_up_makes_the_next_round_a_full_poll():
    clock = Clock()
    cadence = Cadence(0.1, 1.0, clock=clock)
    cadence.after_round(delivered=True, more=False)
    clock.now += cadence.after_round(delivered=False, more=False)
    assert not cadence.full_poll_due(woken=False)
    assert cadence.full_poll_due(woken=True)


def test_with_notifications_every_round_is_a_full_poll():
    clock = Clock()
    cadence = Cadence(0.1, 1.0, clock=clock)
    cadence.pushed = True
    cadence.after_round(delivered=True, more=False)
    clock.now += cadence.after_round(delivered=False, more=False)
    assert not cadence.hot
    assert cadence.full_poll_due(woken=False)
