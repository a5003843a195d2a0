"""PostgreSQL: a worker's sequencing round as one function call (issue 33).

A worker's poll numbers the messages that arrived since its last poll (``db/sequencer.py``).
Written as separate statements that round costs seven round trips (BEGIN, the head locks,
the read, the offsets, the heads, the per-hour counters, COMMIT), on the path between a
message's commit and its handler. ``sqlqueue_sequence_round`` runs the same steps, in the
same order and under the same locks, inside the server: one autocommitted statement.

- The head rows are locked first, in partition order, by a statement of their own.
- The rest is one statement that starts after the locks were granted. A VOLATILE
  function takes a new snapshot for each statement, so that statement sees every message
  committed before the locks, as the separate read does.
- ``numbered`` writes only rows still unsequenced. If it wrote fewer than ``unread`` read
  (a purge or replay deleted one meanwhile), the function raises SQLSTATE ``SQ001`` and
  the whole call rolls back; the sequencer reads afresh (``StaleReadAhead``).
- The counters are counted from the rows the UPDATE returned, in key order.

Returns each partition that moved, with its new head. MySQL, MariaDB and SQLite keep the
separate statements (MySQL's functions cannot return rows, nor take arrays).
"""

from django.db import migrations

# Every % is doubled: the statement goes through the driver's parameter formatting.
FUNCTION = """
CREATE OR REPLACE FUNCTION sqlqueue_sequence_round(
    p_topic varchar, p_partitions bigint[], p_limit integer, p_slots integer
) RETURNS TABLE (moved_partition bigint, moved_head bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    n_read bigint;
    n_written bigint;
    parts bigint[];
    heads bigint[];
BEGIN
    -- (1) The head locks, in partition order: two sequencers cannot deadlock on them.
    PERFORM 1 FROM queue_partitions
        WHERE topic = p_topic AND "partition" = ANY(p_partitions) ORDER BY "partition" FOR UPDATE;
    -- (2)-(5) under the locks, in a snapshot taken after them.
    WITH heads AS (
        SELECT h."partition", h.head_offset FROM queue_partitions h
        WHERE h.topic = p_topic AND h."partition" = ANY(p_partitions)
    ), unread AS (
        SELECT m.seq, heads."partition",
               heads.head_offset + row_number() OVER (PARTITION BY heads."partition" ORDER BY m.seq) AS new_offset
        FROM heads CROSS JOIN LATERAL (
            SELECT u.seq FROM queue_messages u
            WHERE u.topic = p_topic AND u."partition" = heads."partition" AND u."offset" IS NULL
            ORDER BY u.seq LIMIT p_limit
        ) m
    ), numbered AS (
        UPDATE queue_messages q SET "offset" = unread.new_offset FROM unread
        WHERE q.seq = unread.seq AND q."offset" IS NULL
        RETURNING q."partition", q.published_at
    ), moved AS (
        UPDATE queue_partitions p SET head_offset = t.head
        FROM (SELECT "partition", max(new_offset) AS head FROM unread GROUP BY "partition") t
        WHERE p.topic = p_topic AND p."partition" = t."partition"
        RETURNING p."partition", p.head_offset
    ), counted AS (
        INSERT INTO queue_topic_hours (topic, "hour", slot, "messages")
        SELECT p_topic, (date_trunc('hour', n.published_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AS h,
               n."partition" %% p_slots AS s, COUNT(*)
        FROM numbered n GROUP BY h, s ORDER BY h, s
        ON CONFLICT (topic, "hour", slot) DO UPDATE
        SET "messages" = queue_topic_hours."messages" + excluded."messages"
    )
    SELECT (SELECT count(*) FROM unread), (SELECT count(*) FROM numbered),
           (SELECT array_agg(moved."partition" ORDER BY moved."partition") FROM moved),
           (SELECT array_agg(moved.head_offset ORDER BY moved."partition") FROM moved)
    INTO n_read, n_written, parts, heads;
    IF n_read <> n_written THEN
        RAISE EXCEPTION 'sqlqueue: %% of %% messages to number in topic %% are gone', n_read - n_written, n_read, p_topic
            USING ERRCODE = 'SQ001';
    END IF;
    RETURN QUERY SELECT * FROM unnest(parts, heads);
END
$fn$
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS sqlqueue_sequence_round(varchar, bigint[], integer, integer)")


class Migration(migrations.Migration):
    dependencies = [("django_sqlqueue", "0010_history")]
    operations = [migrations.RunPython(create, drop, elidable=False)]
