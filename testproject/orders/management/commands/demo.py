"""``manage.py demo``: the whole flow of django-sqlqueue on whatever database is configured.

1. migrate; 2. place orders through the example view (each order and its event commit
together), and one through a view that rolls back; 3. start two ``runconsumer`` workers
that share the partitions; 4. watch ``queue_status`` until the lag is zero, while the
poison order of "mallory" is retried and dead-lettered; 5. stop the workers gracefully.

``--serve`` then leaves the console running: a demo superuser (its password printed), two
workers, ``runserver --insecure`` on 127.0.0.1 (``--insecure`` serves the admin's CSS and
JavaScript although the test project runs with ``DEBUG=False``: fine for a demo on the
loopback, never for production), and a trickle of orders so that the pages move, until
Ctrl-C; then the workers drain and stop (one SIGTERM each), and so does the server.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test import Client

from django_sqlqueue.models import Message, PartitionLease, SubscriberHeartbeat
from django_sqlqueue.ops.status import queue_status
from testproject.orders.models import Order
from testproject.orders.views import TOPIC

ROOT = Path(__file__).resolve().parents[4]
CUSTOMERS = ["alice", "bob", "carol", "dave", "erin", "mallory"]
#: The console: the admin page of django_sqlqueue (docs/console.md).
CONSOLE_PATH = "/admin/django_sqlqueue/queueconsole/"
#: The superuser ``--serve`` creates (with a fresh random password, printed).
DEMO_USER = "demo"
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
        parser.add_argument(
            "--serve", action="store_true", help="then leave the console running on 127.0.0.1 until Ctrl-C"
        )
        parser.add_argument("--port", type=int, default=8000, help="port of the console with --serve (default 8000)")
        parser.add_argument(
            "--interval", type=float, default=1.0, help="seconds between orders with --serve (default 1)"
        )

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
        if options["serve"]:
            self.serve(options["port"], options["interval"])
            return
        self.stdout.write(
            f"\nSee it in the console (the admin): `bash .ci/demo --serve` (or `python manage.py demo --serve`) "
            f"starts workers, a trickle of orders and a server on http://127.0.0.1:8000{CONSOLE_PATH}, "
            "and prints a login. Docs: docs/console.md, docs/tutorial.md."
        )

    def serve(self, port: int, interval: float) -> None:
        """Leave the console running, with workers and a trickle of orders, until Ctrl-C."""
        from django.contrib.auth import get_user_model

        self.section("8. the console, live")

        def interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(signal.Signals(signum).name)

        # Explicitly, and before the children start (they inherit an ignored signal): a shell
        # starts background jobs with SIGINT ignored. SIGTERM stops as cleanly as Ctrl-C.
        signal.signal(signal.SIGINT, interrupt)
        signal.signal(signal.SIGTERM, interrupt)
        password = secrets.token_urlsafe(9)
        User = get_user_model()
        User.objects.filter(username=DEMO_USER).delete()
        User.objects.create_superuser(DEMO_USER, "demo@example.com", password)
        # Own sessions: a Ctrl-C in the terminal reaches this process only, which stops each
        # child once (a second signal would make a worker exit without draining).
        names = {"worker-1", "worker-2"}
        children = [self.start_worker(name, new_session=True) for name in sorted(names)]
        server_log = tempfile.NamedTemporaryFile(prefix="demo-runserver-", suffix=".log", delete=False)  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--insecure", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=os.environ.copy(),
            stdout=server_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.stdout.write(f"  started runserver --insecure (pid {server.pid}), log: {server_log.name}")
        client, placed = Client(), 0
        try:
            # The console is announced once both workers have registered: it shows them live, and a
            # Ctrl-C from then on reaches workers that drain on SIGTERM (a worker still importing
            # Django has no handler yet, and a SIGTERM then kills it outright: status -15).
            self.wait_for_workers(children, names, timeout=120)
            self.stdout.write(self.style.SUCCESS(f"\n  console: http://127.0.0.1:{port}{CONSOLE_PATH}"))
            self.stdout.write(self.style.SUCCESS(f"  login:   {DEMO_USER} / {password}"))
            self.stdout.write("  placing an order every second (every fifth one is mallory's); Ctrl-C to stop\n")
            self.stdout.flush()
            while True:
                customer = "mallory" if placed % 5 == 4 else CUSTOMERS[placed % (len(CUSTOMERS) - 1)]
                client.post("/orders/", {"customer": customer, "total": f"{5 + placed % 50}.00"})
                placed += 1
                if placed % 30 == 0:
                    self.stdout.write(f"  {placed} orders placed")
                    self.stdout.flush()
                time.sleep(interval)
                if server.poll() is not None:
                    raise CommandError(f"runserver exited ({server.returncode}): {Path(server_log.name).read_text()}")
        except KeyboardInterrupt:
            self.stdout.write("\n  Ctrl-C: stopping")
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # one stop is enough: let the children drain
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for process, _log in children:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            if server.poll() is None:
                server.send_signal(signal.SIGINT)
            for process, log in children:
                code = process.wait(30)
                self.stdout.write(f"  worker pid {process.pid} exited with status {code}")
                if code != 0:
                    self.stdout.write(Path(log.name).read_text()[-2000:])
            try:
                code = server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                code = server.wait(10)
            self.stdout.write(f"  runserver pid {server.pid} exited with status {code}")
            self.stdout.flush()

    def wait_for_workers(self, workers, names: set[str], timeout: float) -> None:
        """Wait until each of ``names`` has a heartbeat row (it registered: its signal handlers are set)."""
        deadline = time.monotonic() + timeout
        registered = SubscriberHeartbeat.objects.filter(subscriber_name__in=names)
        while set(registered.values_list("subscriber_name", flat=True)) != names:
            for process, log in workers:
                if process.poll() is not None:
                    raise CommandError(
                        f"worker pid {process.pid} exited ({process.returncode}): {Path(log.name).read_text()[-2000:]}"
                    )
            if time.monotonic() > deadline:
                raise CommandError(f"the workers did not register within {timeout:.0f}s")
            time.sleep(0.2)

    def start_worker(self, name: str, *, new_session: bool = False):
        # Stays open while the worker writes to it; read back when the worker exits.
        log = tempfile.NamedTemporaryFile(prefix=f"demo-{name}-", suffix=".log", delete=False)  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runconsumer", "--name", name, "-v", "1"],
            cwd=ROOT,
            env={**os.environ, **WORKER_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
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
