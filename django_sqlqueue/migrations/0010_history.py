"""The console's per-minute history (``queue_history``).

Per consumer group, topic and minute: the messages published, handled, failed, retried and
dead-lettered, and the lag, written by the transactions that already happen (the ack, the
nack, the dead letter, the sequencer's round) and by the workers' lag samples. Starts empty:
the minutes before this migration cannot be known. On MySQL/MariaDB the table compares
group and topic names byte for byte, as every queue table does (0002).
"""

from django.db import migrations, models


def binary_collation(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute("ALTER TABLE queue_history CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")


class Migration(migrations.Migration):
    dependencies = [
        ("django_sqlqueue", "0009_task_results_enqueued"),
    ]

    operations = [
        migrations.CreateModel(
            name="HistoryMinute",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "consumer_group",
                        "topic",
                        "minute",
                        "slot",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("consumer_group", models.CharField(max_length=128)),
                ("topic", models.CharField(max_length=160)),
                ("minute", models.BigIntegerField()),
                ("slot", models.PositiveSmallIntegerField()),
                ("published", models.BigIntegerField(default=0)),
                ("handled", models.BigIntegerField(default=0)),
                ("failed", models.BigIntegerField(default=0)),
                ("retried", models.BigIntegerField(default=0)),
                ("dead_lettered", models.BigIntegerField(default=0)),
                ("lag", models.BigIntegerField(blank=True, null=True)),
            ],
            options={
                "db_table": "queue_history",
                "indexes": [models.Index(fields=["minute"], name="queue_history_minute")],
            },
        ),
        migrations.RunPython(binary_collation, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
