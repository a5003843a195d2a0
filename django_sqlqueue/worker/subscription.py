"""A worker's membership in one (consumer group, topic): what it holds and how it runs."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..conf import QueueSettings
from ..consumers import ConsumerOptions, ConsumerSpec
from .threads.executor import PartitionsInFlight


@dataclass
class Subscription:
    """One registered consumer run by one worker under subscriber name ``name``.

    ``held`` is replaced as a whole by the lease keeper thread and read by the poll
    loop; replacing a frozenset is atomic, so readers need no lock.
    """

    spec: ConsumerSpec
    options: ConsumerOptions
    name: str
    held: frozenset[int] = frozenset()
    #: One partition per key (partitions are discovered as keys appear).
    per_key: bool = False
    #: Paused by an operator at the last lease round.
    paused: bool = False
    #: Live subscribers and fair share seen by the last lease round (None: unknown).
    active: int | None = None
    cap: int | None = None
    #: This subscriber's place in the sorted live names (None: unknown); see leasing.
    rank: int | None = None
    #: Held partitions the poll found without the group's watermark row: the keeper
    #: creates them (it is the one place that creates watermark rows).
    missing_offsets: frozenset[int] = frozenset()
    #: Set once the keeper has run its first round (leases taken or not).
    ready: threading.Event = field(default_factory=threading.Event)
    #: Held by the poll loop during a poll; the keeper takes it before giving leases back.
    poll_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Partitions whose batch runs on a handler thread (``--concurrency`` > 1): the keeper
    #: waits for them too before giving a lease back (django_sqlqueue.worker.threads.executor).
    in_flight: PartitionsInFlight = field(default_factory=PartitionsInFlight)

    @classmethod
    def create(cls, spec: ConsumerSpec, name: str, conf: QueueSettings) -> Subscription:
        return cls(spec=spec, options=spec.resolve(conf), name=name, per_key=conf.partitions_for(spec.topic) is None)

    @property
    def group(self) -> str:
        return self.spec.group

    @property
    def topic(self) -> str:
        return self.spec.topic

    @property
    def strict(self) -> bool:
        """batch_size=1: at most one message of a partition in flight at a time."""
        return self.options.batch_size == 1
