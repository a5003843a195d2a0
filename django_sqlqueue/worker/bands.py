"""Priority levels in the poll loop: a queue's levels polled highest first.

A task queue with several priority levels (``tasks/priorities.py``) is one subscription
per level, each with its own topic; their specs carry ``priority_band = (queue, level)``.
The poll loop keeps them together, highest level first (:func:`in_poll_order`), and in
each round skips the lower levels of a queue once a higher one delivered something
(:class:`BandRound`). Lower levels are polled in a round where every higher one had
nothing to deliver -- empty, or its partitions busy -- so a free handler thread takes a
lower-priority task rather than wait (no idle worker while work is ready).

How soon a higher priority starts: at the next round after it was committed (the round's
poll of its level sequences and fetches it). What was fetched before runs first: with
``--concurrency 1`` a poll takes one batch per partition with work and runs them as one job
(at most partitions x ``BATCH_SIZE`` tasks: 80 by default); with ``--concurrency N`` one
batch per free handler thread. Limiting a lower level's poll to one partition would cut
that to one batch, but cost the level's drain more than half its rate (``bench/priorities.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from .subscription import Subscription


def in_poll_order(subscriptions: Iterable[Subscription]) -> list[Subscription]:
    """The subscriptions in the order a round polls them: as given, except that the levels of
    one queue are together, at the place of the first one, highest level first."""
    subs = list(subscriptions)
    first: dict[tuple[str, str], int] = {}
    order: list[tuple[int, int, int]] = []
    for index, sub in enumerate(subs):
        band = sub.spec.priority_band
        if band is None:
            order.append((index, 0, index))
        else:
            place = first.setdefault((sub.group, band[0]), index)
            order.append((place, -band[1], index))
    return [subs[index] for _, _, index in sorted(order)]


class BandRound:
    """Which queues' lower levels a round of the poll loop skips (one per round)."""

    def __init__(self) -> None:
        self._served: set[tuple[str, str]] = set()

    def skips(self, sub: Subscription) -> bool:
        """True if a higher level of ``sub``'s queue delivered in this round."""
        band = sub.spec.priority_band
        return band is not None and (sub.group, band[0]) in self._served

    def polled(self, sub: Subscription, delivered: int) -> None:
        """Record a poll of ``sub`` that delivered ``delivered`` messages."""
        band = sub.spec.priority_band
        if band is not None and delivered > 0:
            self._served.add((sub.group, band[0]))
