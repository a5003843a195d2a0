"""``manage.py demo``: the whole flow of django-sqlqueue on whatever database is configured."""

from __future__ import annotations

import json

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.test import Client

from django_sqlqueue.models import Message, Partition
from testproject.orders.models import Order
from testproject.orders.views import TOPIC


class Command(BaseCommand):
    help = "Migrate, place orders through the example views (one rolls back) and show what was stored."

    def handle(self, *args, **options) -> None:
        self.section("1. migrate")
        call_command("migrate", verbosity=0)
        self.stdout.write("database schema is up to date")

        self.section("2. POST /orders/ : the order row and its event commit in one transaction")
        client = Client()
        for customer, total in [("alice", "19.90"), ("bob", "5.00"), ("alice", "42.00")]:
            response = client.post("/orders/", {"customer": customer, "total": total})
            self.stdout.write(f"  {customer:<6} {total:>6} -> HTTP {response.status_code} {response.content.decode()}")
            assert response.status_code == 201, response.content

        self.section("3. POST /orders/failing/ : publishes, then fails before commit")
        orders_before, messages_before = Order.objects.count(), Message.objects.count()
        response = client.post("/orders/failing/", {"customer": "carol", "total": "7.00"})
        self.stdout.write(f"  carol    7.00 -> HTTP {response.status_code} {response.content.decode()}")
        assert Order.objects.count() == orders_before and Message.objects.count() == messages_before
        self.stdout.write("  rolled back: no order and no event for carol")

        self.section(f"4. what is stored in queue_messages (topic {TOPIC})")
        for message in Message.objects.filter(topic=TOPIC).order_by("partition_key", "offset"):
            self.stdout.write(
                f"  partition={message.partition_key:<6} offset={message.offset:<4} id={message.id:<10} "
                f"payload={json.dumps(message.payload)}"
            )
        self.section("5. partition heads (queue_partitions)")
        for partition in Partition.objects.filter(topic=TOPIC).order_by("partition_key"):
            self.stdout.write(f"  {partition.topic}[{partition.partition_key}] head_offset={partition.head_offset}")
        self.stdout.write(self.style.SUCCESS("\ndemo finished"))

    def section(self, title: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"\n{title}"))
