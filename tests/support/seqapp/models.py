from django.db import models


class Seen(models.Model):
    """One handler call of a sequencing/ordering test worker (tests/processes/test_sequencing.py)."""

    group = models.CharField(max_length=100)
    topic = models.CharField(max_length=100)
    partition = models.BigIntegerField()
    key = models.CharField(max_length=100)
    offset = models.BigIntegerField()
    message_id = models.CharField(max_length=300)
    #: The publisher's sequence number of the message within its key.
    n = models.IntegerField()
    worker = models.CharField(max_length=100)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.group}:{self.topic}[{self.partition}]@{self.offset} {self.message_id}"
