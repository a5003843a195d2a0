"""PostgreSQL: the offsets' UPDATE in ``sqlqueue_sequence_round`` probes the primary key.

The function's UPDATE joins the rows it read (at most its limit per partition) to
``queue_messages`` by ``seq``, writing only rows still unsequenced. After an ``ANALYZE`` that
saw few unsequenced rows, the planner read ``queue_messages`` for that join through the partial
index of unsequenced rows -- by a hash join, or as the outer side of a nested loop -- which is
one pass over every unsequenced message of the topic per round: a cost that grows with a
backlog (found by ``tests/db/test_plans.py``, issue 32's "plans that cannot flip").

PostgreSQL has no index hints, so the statement is shaped to leave one plan:

- "still unsequenced" is written ``coalesce("offset", -1) = -1`` (offsets start at 1). The
  same test, but one the partial index's predicate (``"offset" IS NULL``) cannot prove, so that
  index is no way into the UPDATE; only the primary key on ``seq`` is.
- The function runs without hash joins, merge joins and sequential scans (settings of its own,
  in force only while it runs): what remains is a nested loop over the rows read, one
  primary-key probe each. Every other statement in it reads by a key already.

Same results, locks and order as migration 0011's function.
"""

from importlib import import_module

from django.db import migrations

SIGNATURE = "sqlqueue_sequence_round(varchar, bigint[], integer, integer)"
PREVIOUS = import_module("django_sqlqueue.migrations.0011_postgresql_sequence_round").FUNCTION
FUNCTION = PREVIOUS.replace(
    'WHERE q.seq = unread.seq AND q."offset" IS NULL',
    'WHERE q.seq = unread.seq AND coalesce(q."offset", -1) = -1',
).replace(
    "LANGUAGE plpgsql VOLATILE AS",
    "LANGUAGE plpgsql VOLATILE SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off AS",
)
assert FUNCTION.count("coalesce") == 1 and FUNCTION.count("enable_seqscan") == 1


def pin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def unpin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PREVIOUS)


class Migration(migrations.Migration):
    dependencies = [("django_sqlqueue", "0011_postgresql_sequence_round")]
    operations = [migrations.RunPython(pin, unpin, elidable=False)]
