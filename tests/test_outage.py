"""Database outages: a few log lines, not a traceback per retry; recovery; SIGTERM honoured.

The process tests run a real ``runconsumer`` whose DATABASE_URL points at a TCP proxy
(tests/tcpproxy.py) in front of the real server; the test cuts the proxy (every
connection closed, new ones refused) and restores it. The test itself talks to the
server directly, so it keeps publishing during the outage.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection, connections
from django.db.utils import ProgrammingError

from django_sqlqueue import publish_many
from django_sqlqueue.outage import is_unreachable
from tests.consumerapp.models import Handled
from tests.processes import database_url
from tests.tcpproxy import TcpProxy

from .engine_helpers import caught_up, not_on_sqlite, wait_until

pytestmark = not_on_sqlite("an outage is a database server going away; SQLite is a file in the process")

TOPIC = "proc.events"
KEYS = ["p0", "p1", "p2", "p3"]


# -- classifying errors (real drivers, real refused connections) --------------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


@pytest.mark.django_db
def test_a_refused_connection_is_unreachable_a_bad_query_is_not():
    settings = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(_closed_port())}
    wrapper = type(connections["default"])(settings, alias="unreachable")
    with pytest.raises(DatabaseError) as refused:
        wrapper.ensure_connection()
    assert is_unreachable(refused.value)
    with pytest.raises(ProgrammingError) as bad, connection.cursor() as cursor:
        cursor.execute("SELECT no_such_column FROM queue_message")
    assert not is_unreachable(bad.value)


# -- a real worker behind a proxy ---------------------------------------------------------


@pytest.fixture
def proxy(transactional_db) -> Iterator[TcpProxy]:
    s = connection.settings_dict
    default_port = {"mysql": 3306, "postgresql": 5432}[connection.vendor]
    tcp = TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or default_port))
    yield tcp
    tcp.close()


def proxied_url(proxy: TcpProxy) -> str:
    url = database_url()
    return re.sub(r"@[^/@]+/", f"@127.0.0.1:{proxy.port}/", url)


def start_worker(runconsumer, proxy: TcpProxy, name: str):
    return runconsumer(
        name,
        "--group",
        "g1",
        "--topic",
        TOPIC,
        settings="tests.process_settings_outage",
        verbosity="1",
        env={"DATABASE_URL": proxied_url(proxy)},
    )


def publish_round(tag: str) -> list[str]:
    messages = publish_many(TOPIC, [{"payload": {"tag": tag}, "key": key} for key in KEYS])
    return [m.id for m in messages]


@pytest.mark.slow
def test_outage_is_reported_in_a_few_lines_and_everything_is_handled_after_recovery(runconsumer, proxy):
    before = publish_round("before")
    process = start_worker(runconsumer, proxy, "outage")
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="the first messages handled")

    proxy.cut()
    during = publish_round("during")  # straight to the server, not through the proxy
    wait_until(lambda: "database unreachable" in process.log(), timeout=10, what="the outage line")
    wait_until(lambda: process.log().count("database still unreachable") >= 3, timeout=15, what="three summary lines")
    proxy.restore()
    wait_until(lambda: "database reachable again" in process.log(), timeout=15, what="the recovery line")
    after = publish_round("after")
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="everything handled after the outage")
    assert process.terminate() == 0

    log = process.log()
    assert "Traceback" not in log, log
    lines = log.splitlines()
    starts = [line for line in lines if "database unreachable" in line]
    summaries = [line for line in lines if "database still unreachable" in line]
    recoveries = [line for line in lines if "database reachable again" in line]
    assert len(starts) == 1 and len(recoveries) == 1, log
    expected = "WARNING django_sqlqueue.outage database unreachable, retrying until it is back alias=default error="
    assert expected in starts[0]
    counts = [int(re.search(r"failed_attempts=(\d+)", line).group(1)) for line in summaries]
    assert counts == sorted(counts) and counts[0] >= 2, summaries
    seconds = [int(re.search(r"unreachable after (\d+)s", line).group(1)) for line in summaries]
    assert seconds == sorted(seconds) and seconds[-1] >= 3, summaries
    assert re.search(r"database reachable again after \d+\.\ds failed_attempts=\d+ alias=default", recoveries[0])
    # Only a handful of lines over the whole outage (start, ~1 a second, recovery, lease churn).
    outage_lines = lines[lines.index(starts[0]) : lines.index(recoveries[0]) + 1]
    assert len(outage_lines) <= len(summaries) + 12, "\n".join(outage_lines)

    handled = Counter(Handled.objects.filter(topic=TOPIC, group="g1").values_list("message_id", flat=True))
    assert handled == Counter(dict.fromkeys([*before, *during, *after], 1))


@pytest.mark.slow
def test_sigterm_during_an_outage_exits_within_two_seconds(runconsumer, proxy):
    publish_round("before")
    process = start_worker(runconsumer, proxy, "sigterm")
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="the first messages handled")

    proxy.cut()
    wait_until(lambda: "database unreachable" in process.log(), timeout=10, what="the outage line")
    time.sleep(1.5)  # in the middle of the retries
    started = time.monotonic()
    assert process.terminate(timeout=10) == 0
    elapsed = time.monotonic() - started
    log = process.log()
    assert elapsed < 2.0, f"took {elapsed:.1f}s to exit:\n{log}"
    assert "Traceback" not in log, log
    assert "could not release leases, database unreachable; they expire in 3s group=g1" in log
    assert "worker stopped subscriber=sigterm" in log
