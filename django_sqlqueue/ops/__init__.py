"""The operator's services: what the admin console, the ``queue_*`` commands and Python share.

Framework-free of the admin and of management commands: every function takes plain
values, validates them (:class:`OperationError` naming the problem, nothing written) and
runs on the queue database: ``using=``, else the one :func:`on_database` chose, else the
topic's own (``SQLQUEUE["TOPIC_DATABASES"]``) or ``SQLQUEUE["DATABASE"]``; listings without
a topic read every database and name each row's (see ``ops/base.py``)::

    from django_sqlqueue import ops

    ops.overview().problems
    ops.check_health(ops.Thresholds(max_lag=1000, require_subscribers=True)).problems
    ops.plan_seek("billing", "orders", position="earliest").redeliver
    ops.seek("billing", "orders", time=yesterday)
    ops.pause("billing", "orders", by="alice", reason="bad deploy")
    ops.drop_group("old-reporting")
    ops.replay_matching(ops.DeadLetterFilter(topic="orders", group="billing"), actor="alice")
"""

from __future__ import annotations

from .base import NotFound, OperationError, on_database
from .deadletters import DeadLetter, DeadLetterFilter, count_dead_letters, get_dead_letter, list_dead_letters
from .groups import GroupDrop, drop_group, group_offsets, list_groups, parse_partitions
from .health import Health, Thresholds, check_health, configured_thresholds, dead_letter_cap, overview_problems
from .history import Point, Series, Summary, group_history, group_summary, histories, summarize
from .leases import list_deliveries, list_leases, list_subscribers, release_lease
from .messages import MessageFilter, browse, get_message
from .overview import Overview, consumer_atomic, overview
from .pausing import pause, paused_topics, resume
from .replay import BulkResult, purge, purge_matching, replay, replay_matching
from .seek import SeekPlan, plan_seek, seek
from .topics import Repartition, TopicInfo, TopicPurge, list_topics, log_topics, purge_topic, repartition_topic

__all__ = [
    "BulkResult",
    "DeadLetter",
    "DeadLetterFilter",
    "GroupDrop",
    "Health",
    "MessageFilter",
    "NotFound",
    "OperationError",
    "Overview",
    "Point",
    "Repartition",
    "SeekPlan",
    "Series",
    "Summary",
    "Thresholds",
    "TopicInfo",
    "TopicPurge",
    "browse",
    "check_health",
    "configured_thresholds",
    "consumer_atomic",
    "count_dead_letters",
    "dead_letter_cap",
    "drop_group",
    "get_dead_letter",
    "get_message",
    "group_history",
    "group_offsets",
    "group_summary",
    "histories",
    "list_dead_letters",
    "list_deliveries",
    "list_groups",
    "list_leases",
    "list_subscribers",
    "list_topics",
    "log_topics",
    "on_database",
    "overview",
    "overview_problems",
    "parse_partitions",
    "pause",
    "paused_topics",
    "plan_seek",
    "purge",
    "purge_matching",
    "purge_topic",
    "release_lease",
    "repartition_topic",
    "replay",
    "replay_matching",
    "resume",
    "seek",
    "summarize",
]
