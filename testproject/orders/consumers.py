"""Example consumers of the demo: billing charges orders, analytics counts them.

Orders of customer "mallory" carry a card that always fails: billing retries them
with backoff and, after max_attempts, they land in ``orders.created_dlq``.
"""

from __future__ import annotations

import logging

from django_sqlqueue import ReceivedMessage, consumer

logger = logging.getLogger("django_sqlqueue.demo")


class CardDeclined(Exception):
    pass


@consumer("orders.created", group="billing", batch_size=10, visibility_timeout=30, max_attempts=3)
def charge(message: ReceivedMessage) -> None:
    order = message.payload
    if order["customer"] == "mallory":
        raise CardDeclined(f"card of {order['customer']} declined for order {order['order_id']}")
    logger.info(
        "billing: charged order %s (%s, %s) partition=%d offset=%d attempt=%d",
        order["order_id"],
        order["customer"],
        order["total"],
        message.partition,
        message.offset,
        message.attempt,
    )


@consumer("orders.created", group="analytics", batch_size=50)
def count(message: ReceivedMessage) -> None:
    logger.info("analytics: saw order %s offset=%d", message.payload["order_id"], message.offset)
