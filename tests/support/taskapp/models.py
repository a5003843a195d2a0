"""What the test tasks and consumers record, to check who ran what, when and in which order."""

from __future__ import annotations

from django.db import models


class Run(models.Model):
    label = models.CharField(max_length=100)
    #: Ordering key / partition and position in it, where the test needs them.
    key = models.CharField(max_length=100, blank=True, default="")
    seq = models.IntegerField(default=0)
    pid = models.IntegerField()
    started = models.FloatField()
    finished = models.FloatField(null=True)

    class Meta:
        indexes = [models.Index(fields=["label"])]

    def __str__(self) -> str:
        return f"{self.label} key={self.key} seq={self.seq} pid={self.pid}"
