"""Every database operation of the consumer side, one module per responsibility.

The worker (``worker/``, its lease keeper and scheduler in ``worker/threads/``), garbage
collection, the operator services (``ops``, ``queue_status`` among them) and the
integrations call these methods; none of them writes SQL of its own against the queue
tables. Vendor differences come from the dialect (``db/dialects/``). The sequencer, which
numbers committed messages, lives in ``db/sequencer.py``.

- ``heartbeats.py``: subscriber liveness, for fair share;
- ``topics.py``: the topic registry and partition head rows;
- ``leases.py``: renewing, acquiring and releasing partition leases;
- ``polling.py``: the poll's state query (which held partitions may have work);
- ``delivery.py``: the fetch, recording deliveries;
- ``acks.py``: acks, nacks and the watermark, fenced by the lease;
- ``dead_lettering.py``: a delivery's dead letter and its ack, fenced the same way;
- ``settle.py``: a consumer's bookkeeping of final outcomes, in the ack's transaction;
- ``atomic_acks.py``: the atomic consumers' ack, inside the handler's own transaction;
- ``gc.py``: deleting what every group has processed;
- ``messages.py``: appending messages (publish, dead letters, replayed copies);
- ``deadletters.py``: locking and deleting dead letters for an operator's replay or purge;
- ``positions.py``: operator writes to a group's positions (release, seek, pause, drop,
  purge), fenced by deleting the lease rows first;
- ``reports.py``: grouped reads of groups and partitions for operators (heads,
  watermarks, lag, subscribers, leases, pauses) and the one definition of lag, of in
  flight and of retrying;
- ``message_reports.py``: grouped reads about messages for operators (deliveries by
  status, dead-letter counts, the log's topics and hourly counters);
- ``log.py``: reads of the log for export and streaming (the Spark data source and
  pipelines); its ``LogStore`` is not part of :class:`QueueStore`;
- ``schedules.py``: the recurring schedules' bookkeeping (``queue_schedules``), for the
  workers' scheduler thread;
- ``history.py``: the console's per-minute history (counted by the acks, nacks, dead
  letters and the sequencer in their transactions; lag samples, pruning, reads);
- ``limits.py``: rate limits (GCRA), concurrency slots, and postponing a delivery that
  waits for them without counting an attempt.

Locking, in short (READ COMMITTED on MySQL):

- Only the subscriber holding a partition's lease writes that partition's delivery state
  and watermark for its group: each such write transaction share-locks the lease rows
  first and writes only the partitions still held.
- Statements touch one (group, topic) and primary-key ranges of it; multi-row writes list
  keys in sorted order. Deadlocks (1213) and lost connections are retried by the caller
  (``retry.py``), so every method here is safe to run again.
- Times compared across processes -- leases, heartbeats, visibility -- are computed in
  SQL from the database clock, never from a worker's clock.
"""

from __future__ import annotations

from .acks import ADVANCE_SCAN, AckStore
from .atomic_acks import AtomicAckStore
from .base import IN_FLIGHT, RETRY, SCHEDULED, StoreBase
from .dead_lettering import DeadLetteringStore
from .deadletters import DeadLetterStore
from .delivery import FETCH_CHUNK, DeliveryStore, FetchedMessage, FetchPlan
from .gc import GCStore
from .heartbeats import HeartbeatStore
from .history import HistoryStore
from .leases import LeaseStore
from .limits import LimitStore
from .message_reports import MessageReportStore
from .polling import POLL_COLUMNS, PartitionState, PollStore
from .positions import PositionStore
from .reports import DeliveryCounts, PartitionLag, ReportStore, lag
from .schedules import ScheduleStore
from .settle import Settlement, Settling
from .topics import TopicStore


class QueueStore(
    HeartbeatStore,
    TopicStore,
    LeaseStore,
    PollStore,
    DeliveryStore,
    AckStore,
    DeadLetteringStore,
    AtomicAckStore,
    GCStore,
    PositionStore,
    ReportStore,
    MessageReportStore,
    DeadLetterStore,
    ScheduleStore,
    LimitStore,
    HistoryStore,
):
    """The queue's SQL on one database alias (the union of the store modules)."""


__all__ = [
    "ADVANCE_SCAN",
    "FETCH_CHUNK",
    "IN_FLIGHT",
    "POLL_COLUMNS",
    "RETRY",
    "SCHEDULED",
    "DeliveryCounts",
    "FetchPlan",
    "FetchedMessage",
    "PartitionLag",
    "PartitionState",
    "PollStore",
    "QueueStore",
    "Settlement",
    "Settling",
    "StoreBase",
    "lag",
]
