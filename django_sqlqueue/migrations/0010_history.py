"""The console's per-minute history (``queue_history``) and the running totals it samples.

``queue_offsets`` gets four running totals per group and partition (handled, failed,
retried, dead-lettered), added by the transactions that commit those outcomes; the workers
sample them, with the heads and the lag, into ``queue_history`` every few seconds. The
totals start at 0 here: the history starts with this migration. On MySQL/MariaDB the new
table compares group and topic names byte for byte, as every queue table does (0002). The
new columns have a database default (MariaDB 10.3+ and PostgreSQL 11+ add them without
rewriting the table).
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
        migrations.AddField(
            model_name="consumeroffset", name="handled_total", field=models.BigIntegerField(db_default=0)
        ),
        migrations.AddField(
            model_name="consumeroffset", name="failed_total", field=models.BigIntegerField(db_default=0)
        ),
        migrations.AddField(
            model_name="consumeroffset", name="retried_total", field=models.BigIntegerField(db_default=0)
        ),
        migrations.AddField(
            model_name="consumeroffset", name="dead_lettered_total", field=models.BigIntegerField(db_default=0)
        ),
        migrations.CreateModel(
            name="HistoryMinute",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "consumer_group",
                        "topic",
                        "minute",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("consumer_group", models.CharField(max_length=128)),
                ("topic", models.CharField(max_length=160)),
                ("minute", models.BigIntegerField()),
                ("published", models.BigIntegerField(default=0)),
                ("handled", models.BigIntegerField(default=0)),
                ("failed", models.BigIntegerField(default=0)),
                ("retried", models.BigIntegerField(default=0)),
                ("dead_lettered", models.BigIntegerField(default=0)),
                ("lag", models.BigIntegerField(default=0)),
            ],
            options={
                "db_table": "queue_history",
                "indexes": [models.Index(fields=["minute"], name="queue_history_minute")],
            },
        ),
        migrations.RunPython(binary_collation, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
