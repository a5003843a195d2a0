"""Messages per topic per hour, counted by the sequencer (``queue_topic_hours``).

The report's "messages per hour" used to count the log, so a topic whose messages were
consumed and garbage-collected vanished from it. The sequencer now counts each message
it numbers, in the transaction that numbers it (``sequencer.count_sequenced``).

Also here: on MySQL/MariaDB the table compares topics byte for byte, as every queue
table does (0002); and a backfill counts the messages already numbered and still in the
log, so the hours before this migration are not empty. Messages garbage-collected before
it cannot be counted. Apply it before starting workers of this version (their sequencer
writes the table): a sequencer of this version running while the backfill runs could
count its round twice.
"""

from django.db import migrations, models


def binary_collation(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute("ALTER TABLE queue_topic_hours CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")


def backfill(apps, schema_editor):
    """Count the numbered messages still in the log: one INSERT ... SELECT ... GROUP BY."""
    from django_sqlqueue.db.dialects import get_dialect
    from django_sqlqueue.models import TOPIC_HOUR_SLOTS

    connection = schema_editor.connection
    d = get_dialect(connection)
    qn = d.qn
    hour = d.hour_sql(qn("published_at"))
    n = qn("messages")
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO queue_topic_hours (topic, {qn('hour')}, slot, {n}) "
            f"SELECT topic, {hour} AS h, {qn('partition')} %% {TOPIC_HOUR_SLOTS} AS s, COUNT(*) "
            f"FROM queue_messages WHERE {qn('offset')} IS NOT NULL GROUP BY topic, h, s ORDER BY topic, h, s "
            f"{d.on_conflict_update(['topic', 'hour', 'slot'])} {n} = {d.counter_sum(n)}",
            [],
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_sqlqueue", "0006_delivery_last_error"),
    ]

    operations = [
        migrations.CreateModel(
            name="TopicHour",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "topic", "hour", "slot", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("topic", models.CharField(max_length=160)),
                ("hour", models.DateTimeField()),
                ("slot", models.PositiveSmallIntegerField()),
                ("messages", models.BigIntegerField(default=0)),
            ],
            options={
                "db_table": "queue_topic_hours",
                "indexes": [models.Index(fields=["hour"], name="queue_topic_hours_hour")],
            },
        ),
        # Not in a transaction: MySQL commits DDL at once (and Django refuses DDL in atomic() there).
        migrations.RunPython(binary_collation, migrations.RunPython.noop, atomic=False, elidable=False),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=False),
    ]
