"""``manage.py demo``: the whole flow of django-sqlqueue on whatever database is configured.

1. migrate; 2. place orders through the example view (each order and its event commit
together), and one through a view that rolls back; 3. start two ``runconsumer`` workers
that share the partitions; 4. watch ``queue_status`` until the lag is zero, while the
poison order of "mallory" is retried and dead-lettered; 5. stop the workers gracefully.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test import Client

from django_sqlqueue.models import Message, PartitionLease
from django_sqlqueue.status import queue_status
from testproject.orders.models import Order
from testproject.orders.views import TOPIC

ROOT = Path(__file__).resolve().parents[4]
CUSTOMERS = ["alice", "bob", "carol", "dave", "erin", "mallory"]
#: Fast clocks so the demo finishes in seconds (production defaults are slower).
WORKER_ENV = {
    "SQLQUEUE_POLL_INTERVAL": "0.05",
    "SQLQUEUE_POLL_INTERVAL_MAX": "0.2",
    "SQLQUEUE_LEASE_DURATION": "3",
    "SQLQUEUE_LEASE_RENEW_INTERVAL": "0.5",
    "SQLQUEUE_BACKOFF_MIN": "0.2",
    "SQLQUEUE_BACKOFF_MAX": "0.5",
}


class Command(BaseCommand):
    help = "Run the django-sqlqueue demo: publish in transactions, two workers, a dead letter, lag to zero."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--orders", type=int, default=30, help="orders to place (default 30)")
        parser.add_argument("--timeout", type=float, default=90, help="seconds to wait for the lag to reach zero")

    def handle(self, *args, **options) -> None:
        self.section("1. migrate")
        call_command("migrate", verbosity=0)
        self.stdout.write("database schema is up to date")

        self.section("2. POST /orders/ : each order row and its event commit in one transaction")
        client = Client()
        for i in range(options["orders"]):
            customer = CUSTOMERS[i % len(CUSTOMERS)]
            response = client.post("/orders/", {"customer": customer, "total": f"{10 + i}.50"})
            if response.status_code != 201:
                raise CommandError(f"order view failed: {response.status_code} {response.content!r}")
            if i < 3 or customer == "mallory":
                self.stdout.write(f"  {customer:<8} -> HTTP 201 {response.content.decode()}")
        self.stdout.write(f"  ... {options['orders']} orders placed")

        self.section("3. POST /orders/failing/ : publishes, then fails before commit")
        orders_before, messages_before = Order.objects.count(), Message.objects.count()
        response = client.post("/orders/failing/", {"customer": "carol", "total": "7.00"})
        self.stdout.write(f"  carol    -> HTTP {response.status_code} {response.content.decode()}")
        if Order.objects.count() != orders_before or Message.objects.count() != messages_before:
            raise CommandError("the rolled-back order left rows behind")
        self.stdout.write("  rolled back: no order and no event")

        self.section("4. two `manage.py runconsumer` workers share the partitions")
        workers = [self.start_worker(name) for name in ("worker-1", "worker-2")]
        try:
            self.watch(options["timeout"])
            self.section("5. leases: each worker holds its fair share")
            for lease in PartitionLease.objects.filter(consumer_group="billing").order_by("partition"):
                self.stdout.write(f"  billing {lease.topic}[{lease.partition}] leased by {lease.leased_by}")
        finally:
            self.section("6. SIGTERM: workers finish the message in hand, release leases, deregister")
            for process, _log in workers:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process, log in workers:
                code = process.wait(30)
                self.stdout.write(f"  worker pid {process.pid} exited with status {code}")
                if code != 0:
                    self.stdout.write(Path(log.name).read_text()[-2000:])
        self.stdout.write(f"  leases left: {PartitionLease.objects.count()}")

        self.section(f"7. the dead letter in {TOPIC}_dlq")
        for dead in Message.objects.filter(topic=f"{TOPIC}_dlq").order_by("seq"):
            self.stdout.write(
                f"  id={dead.id} original_topic={dead.original_topic} failures={dead.failure_count}\n"
                f"  payload={json.dumps(dead.payload)}\n  last_error={dead.last_error.splitlines()[0]}"
            )
        self.stdout.write("")
        call_command("queue_status", stdout=self.stdout)
        self.stdout.write(self.style.SUCCESS("\ndemo finished"))

    def start_worker(self, name: str):
        # Stays open while the worker writes to it; read back when the worker exits.
        log = tempfile.NamedTemporaryFile(prefix=f"demo-{name}-", suffix=".log", delete=False)  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runconsumer", "--name", name, "-v", "1"],
            cwd=ROOT,
            env={**os.environ, **WORKER_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.stdout.write(f"  started {name} (pid {process.pid}), log: {log.name}")
        return process, log

    def watch(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = queue_status(topic=TOPIC)
            groups = {g.group: g for g in status.groups}
            line = "  ".join(
                f"{g.group}: lag={g.lag} in_flight={g.in_flight} retrying={g.retrying} dlq={g.dead_letters} "
                f"subscribers={g.live_subscribers}"
                for g in status.groups
            )
            self.stdout.write(f"  {line or 'waiting for the workers to register...'}")
            done = (
                {"billing", "analytics"} <= set(groups)
                and all(g.lag == 0 for g in groups.values())
                and groups["billing"].dead_letters > 0
            )
            if done:
                self.stdout.write("  lag is zero for every group")
                return
            if time.monotonic() > deadline:
                raise CommandError(f"lag did not reach zero within {timeout}s")
            time.sleep(1)

    def section(self, title: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"\n{title}"))
