from decimal import Decimal

from django.db import models


class Order(models.Model):
    """An example business row, written in the same transaction as its event."""

    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2, default=Decimal("0"))
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Order #{self.pk} for {self.customer}"
