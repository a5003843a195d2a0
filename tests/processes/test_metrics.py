"""``runconsumer --metrics-port``: a real worker process's counters and histogram, scraped over HTTP."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_sqlqueue import publish_many
from django_sqlqueue.db.store import QueueStore

from ..support.ports import free_port
from ..support.processes import wait_until


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


G1 = (("database", "default"), ("group", "g1"), ("topic", "proc.events"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_counts_what_its_handlers_did(runconsumer):
    port = free_port()
    worker = runconsumer(
        "m1", "--group", "g1", "--topic", "proc.events", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"
    )
    wait_until(lambda: answers(port), 30, "the metrics port answers", show=worker.log)
    assert ("sqlqueue_messages_processed_total", G1) not in scrape(port)  # nothing handled yet
    # 5 handled fine; 2 fail every attempt (max_attempts=3: 2 retries, then a dead letter each);
    # 1 rejected (a dead letter at once).
    publish_many(
        "proc.events",
        [{"payload": {"n": i}, "key": f"k{i}"} for i in range(5)]
        + [{"payload": {"fail": ["g1"]}, "key": f"f{i}"} for i in range(2)]
        + [{"payload": {"reject": ["g1"]}, "key": "r0"}],
    )

    def done():
        found = scrape(port)
        return found if found.get(("sqlqueue_messages_dead_lettered_total", G1)) == 3 else None

    found = wait_until(done, 60, "three dead letters counted", show=worker.log)
    assert found[("sqlqueue_messages_processed_total", G1)] == 5
    assert found[("sqlqueue_messages_failed_total", G1)] == 7
    assert found[("sqlqueue_messages_retried_total", G1)] == 4
    assert found[("sqlqueue_messages_rejected_total", G1)] == 1
    assert found[("sqlqueue_messages_delivered_total", G1)] == 12
    assert found[("sqlqueue_handler_duration_seconds_count", G1)] == 12
    assert found[("sqlqueue_handler_duration_seconds_bucket", tuple(sorted((*G1, ("le", "+Inf")))))] == 12
    assert found.get(("sqlqueue_messages_timed_out_total", G1), 0) == 0
    # The worker's hooks: every delivery went out in a batch; one worker numbered all 8
    # messages and holds every partition of the topic.
    assert found[("sqlqueue_batch_size_sum", G1)] == 12
    assert 1 <= found[("sqlqueue_batch_size_count", G1)] <= 12
    polls = found[("sqlqueue_polls_total", G1)]
    assert polls >= found[("sqlqueue_batch_size_count", G1)] / 8
    assert 0 < found[("sqlqueue_polls_empty_total", G1)] < polls
    assert found[("sqlqueue_poll_duration_seconds_count", G1)] == polls
    topic = (("database", "default"), ("topic", "proc.events"))
    assert found[("sqlqueue_sequenced_messages_total", topic)] == 8
    runs = found[("sqlqueue_sequencer_runs_total", topic)]
    assert runs >= 1 and found[("sqlqueue_sequencer_duration_seconds_count", topic)] == runs
    assert found[("sqlqueue_leases_acquired_total", G1)] == QueueStore("default").partition_count("proc.events")
    assert found.get(("sqlqueue_leases_lost_total", G1), 0) == 0
    assert worker.terminate() == 0


def test_a_bad_port_is_refused():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--metrics-port must be a TCP port"):
        call_command("runconsumer", "--group", "g1", "--topic", "proc.events", "--metrics-port", "70000")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_hung_handler_counts_as_timed_out(runconsumer):
    from django_sqlqueue import publish

    from ..support.engine_helpers import key_for_partition

    port = free_port()
    worker = runconsumer(
        "m2", "--group", "hang", "--topic", "proc.hang", "--concurrency", "2", "--metrics-port", str(port)
    )
    worker.expected_status = 1  # as in test_watchdog_processes: stuck threads may stop the worker
    wait_until(lambda: answers(port), 30, "the metrics port answers", show=worker.log)
    publish("proc.hang", {"hang": True}, key=key_for_partition(0))
    hang = (("database", "default"), ("group", "hang"), ("topic", "proc.hang"))

    def dead_lettered():
        found = scrape(port)
        return found if found.get(("sqlqueue_messages_dead_lettered_total", hang)) == 1 else None

    # max_attempts=2, timeout = visibility timeout (3 s): two timed-out attempts, then the dead letter.
    found = wait_until(dead_lettered, 30, "the hung message dead-lettered", show=worker.log)
    assert found[("sqlqueue_messages_timed_out_total", hang)] == 2
    assert found[("sqlqueue_messages_failed_total", hang)] == 2
    assert found[("sqlqueue_messages_retried_total", hang)] == 1
    assert found.get(("sqlqueue_messages_processed_total", hang), 0) == 0
    assert found[("sqlqueue_handler_duration_seconds_sum", hang)] >= 2 * 2.5
