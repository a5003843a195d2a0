"""Partition leases and subscriber heartbeats; releasing a lease."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ..conf import get_settings
from ..db.store import IN_FLIGHT, RETRY, SCHEDULED
from .base import NotFound, first_line, listing_aliases, store, topic_alias


@dataclass(frozen=True)
class Lease:
    group: str
    topic: str
    partition: int
    leased_by: str
    leased_at: dt.datetime | None
    renewed_at: dt.datetime | None
    #: Not renewed within LEASE_DURATION: its holder is gone or stuck.
    stale: bool
    #: The database alias that holds the lease.
    database: str = ""


@dataclass(frozen=True)
class Subscriber:
    group: str
    topic: str
    name: str
    heartbeat_at: dt.datetime | None
    deregistered_at: dt.datetime | None
    live: bool
    #: The database alias that holds the heartbeat row.
    database: str = ""

    @property
    def silent(self) -> bool:
        """Registered (not deregistered) but without a heartbeat within LEASE_DURATION."""
        return self.deregistered_at is None and not self.live


def list_leases(
    group: str | None = None, topic: str | None = None, *, stale_only: bool = False, using: str | None = None
) -> list[Lease]:
    """Return the partition leases, sorted; a lease not renewed within LEASE_DURATION is stale.

    Of ``topic``'s database, or ``using``; without either, of every database.
    """
    duration = get_settings().LEASE_DURATION
    return [
        Lease(*row, database=db)
        for db in listing_aliases(topic, using)
        for row in store(db).leases(group, topic, duration, stale_only=stale_only)
    ]


def list_subscribers(group: str | None = None, topic: str | None = None, using: str | None = None) -> list[Subscriber]:
    """Return the subscribers (heartbeat rows), sorted; live: a heartbeat within LEASE_DURATION.

    Of ``topic``'s database, or ``using``; without either, of every database.
    """
    duration = get_settings().LEASE_DURATION
    return [
        Subscriber(*row, database=db)
        for db in listing_aliases(topic, using)
        for row in store(db).subscribers(group, topic, duration)
    ]


def release_lease(
    group: str, topic: str, partition: int, *, holder: str | None = None, using: str | None = None
) -> int:
    """Delete a partition's lease; return 1, or raise :class:`NotFound`.

    With ``holder`` only that subscriber's lease is deleted (the console passes the
    holder it showed, so a lease another subscriber took meanwhile is left alone). The
    holder's fenced writes to the partition become no-ops at once and it drops the
    partition at its next lease round; a subscriber of the group then takes it (see
    :meth:`~django_sqlqueue.db.store.positions.PositionStore.release_lease`).
    """
    deleted = store(topic_alias(topic, using)).release_lease(group, topic, int(partition), holder)
    if not deleted:
        raise NotFound(
            f"no lease of {group}:{topic}[{partition}]"
            + (f" held by {holder!r}" if holder else "")
            + " (released already?)."
        )
    return deleted


@dataclass(frozen=True)
class Delivery:
    """A message a group is working on or will retry."""

    group: str
    topic: str
    partition: int
    offset: int
    status: str
    #: Deliveries so far minus one (the engine's ``retry_count``).
    retry_count: int
    #: In flight: when the visibility timeout ends; retrying: when it is due again.
    visible_at: dt.datetime | None
    message_id: str | None
    key: str | None
    #: The last failed attempt's error (type: message, then traceback), or None.
    last_error: str | None = None
    #: The database alias that holds the delivery state.
    database: str = ""

    @property
    def error_summary(self) -> str:
        """The first line of ``last_error`` ("module.Class: message"), or ""."""
        return first_line(self.last_error)


#: Delivery status codes as the console names them.
STATUS = {SCHEDULED: "scheduled", IN_FLIGHT: "in flight", RETRY: "retrying"}


def list_deliveries(
    group: str | None = None,
    topic: str | None = None,
    *,
    status: str | None = None,
    limit: int = 200,
    using: str | None = None,
) -> list[Delivery]:
    """Return unacked delivery state (in flight, retrying, scheduled), soonest visible first, with message ids.

    Of ``topic``'s database, or ``using``; without either, of every database (``limit`` rows each).
    """
    code = None
    if status is not None:
        codes = [c for c, name in STATUS.items() if name == status]
        if not codes:
            raise NotFound(f"status must be one of {', '.join(STATUS.values())}, got {status!r}.")
        code = codes[0]
    return [
        Delivery(g, t, part, off, STATUS.get(st, str(st)), rc, vis, mid, key, err, db)
        for db in listing_aliases(topic, using)
        for g, t, part, off, st, rc, vis, mid, key, err in store(db).deliveries(group, topic, code, limit)
    ]
