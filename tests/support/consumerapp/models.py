from django.db import models


class Handled(models.Model):
    """One handler call in a test worker process, recorded before the handler's outcome."""

    group = models.CharField(max_length=100)
    topic = models.CharField(max_length=100)
    partition = models.BigIntegerField()
    key = models.CharField(max_length=128, blank=True, default="")
    offset = models.BigIntegerField()
    message_id = models.CharField(max_length=300)
    attempt = models.IntegerField()
    worker = models.CharField(max_length=100)
    handled_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.group}:{self.topic}[{self.partition}]@{self.offset} attempt {self.attempt} by {self.worker}"
