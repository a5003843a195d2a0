"""An index for the console's list of every task result, newest first.

The Tasks tab pages through ``queue_task_results`` by ``(enqueued_at, id)`` descending (a
keyset). Without an index the unfiltered list sorted the whole table on every page (93 ms at
200,000 results on MariaDB, more as results accumulate); with it a page reads 51 index
entries. ``enqueued_at`` is written once, when the result row is inserted, and grows with time,
so the entry lands at the index's right edge.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_sqlqueue", "0008_task_features")]

    operations = [
        migrations.AddIndex(
            model_name="taskresultrecord",
            index=models.Index(fields=["enqueued_at", "id"], name="queue_task_enqueued"),
        ),
    ]
