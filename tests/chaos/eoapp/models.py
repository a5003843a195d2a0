"""The application tables of the exactly-once run (tests/chaos/exactly_once.py).

``Effect`` has deliberately **no** unique constraint: a handler that runs twice for one
message leaves two rows, which is what the run counts. ``Counter`` is one row per consumer
group, incremented by every handling (``UPDATE ... SET n = n + 1``).
"""

from __future__ import annotations

from django.db import models


class Effect(models.Model):
    """One handling of one message by one group: no unique constraint, on purpose."""

    message_id = models.CharField(max_length=100)
    consumer_group = models.CharField(max_length=50)
    worker = models.CharField(max_length=100)
    pid = models.IntegerField()
    attempt = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.message_id} by {self.worker}"


class Counter(models.Model):
    name = models.CharField(max_length=50, primary_key=True)
    n = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.n}"
