"""A worker's membership in one (consumer group, topic): what it holds and how it runs."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .conf import QueueSettings
from .consumers import ConsumerOptions, ConsumerSpec


@dataclass
class Subscription:
    """One registered consumer run by one worker under subscriber name ``name``.

    ``held`` is replaced as a whole by the lease keeper thread and read by the poll
    loop; replacing a frozenset is atomic, so readers need no lock.
    """

    spec: ConsumerSpec
    options: ConsumerOptions
    name: str
    held: frozenset[str] = frozenset()
    #: Live subscribers and fair share seen by the last lease round (None: unknown).
    active: int | None = None
    cap: int | None = None
    #: Set once the keeper has run its first round (leases taken or not).
    ready: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def create(cls, spec: ConsumerSpec, name: str, conf: QueueSettings) -> Subscription:
        return cls(spec=spec, options=spec.resolve(conf), name=name)

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
