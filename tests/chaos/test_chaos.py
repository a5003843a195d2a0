"""The chaos suite (``pytest -m chaos tests/chaos``; CI runs it beside the MariaDB suite).

One run per database, on a server the test starts itself: >= 10,000 messages published
while workers are killed, paused, disconnected, the server restarted and one handler hangs.
What each run must show, and why each rule is what the README promises, is in
docs/reliability.md; tests/chaos/harness.py does the work.
"""

from __future__ import annotations

import inspect
import json
import os
import random
from collections.abc import Callable

import pytest

from django_sqlqueue import consumer
from tests.chaos.harness import GROUPS, HANG_GROUP, HUNG_ID, ChaosRun, Plan, format_report
from tests.support.dbservers import missing

pytestmark = pytest.mark.chaos

#: Loose sanity bounds (seconds): the measured times are reported, not tuned against.
RECOVERY_BOUND = 60.0
#: A hung handler must not stall its worker's other partitions much longer than its
#: timeout (3 s) + a lease (3 s) + a visibility timeout (4 s).
HUNG_BOUND = 30.0


@pytest.mark.parametrize("kind", ["mariadb", "postgresql"])
def test_nothing_is_lost_and_order_holds_under_chaos(kind: str, chaos_report: Callable[[str], None]) -> None:
    reason = missing().get(kind)
    if reason:
        pytest.skip(reason)
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1_000_000))
    run = ChaosRun(kind, Plan(seed=seed))
    failed = True
    try:
        report = run.execute()
        chaos_report(format_report(report, run.t0))
        if os.environ.get("CHAOS_REPORT_FILE"):
            with open(os.environ["CHAOS_REPORT_FILE"], "a") as f:
                f.write(json.dumps(report.as_dict(), default=str) + "\n")

        assert report.published >= 10_000
        for group in GROUPS:
            g = report.groups[group]
            assert g["lost"] == 0, f"{group} lost {g['lost']} messages, e.g. {g['lost_ids']}"
            assert g["unknown"] == [], f"{group} handled ids nobody published: {g['unknown']}"
            assert g["order_violations"] == 0, f"{group}: {g['violations']}"

        kinds = [f.kind for f in report.faults]
        assert kinds.count("kill -9") >= 20
        assert kinds.count("SIGSTOP") >= 1 and kinds.count("SIGSTOP in handler") >= 1
        # A paused worker's late acks are dropped by the lease fence: what it handled after
        # SIGCONT, of partitions taken meanwhile, is redelivered (and there was some).
        assert report.late_fenced >= 1, "no SIGSTOP left a late ack to fence: the fencing check proved nothing"
        assert kinds.count("server restart") == 1
        # Frozen inside a batch's outcome transaction (its lease rows share-locked): the
        # server ends that session once it idled past the bound (db/session.py), so others
        # take its partitions while it is still stopped, not after SIGCONT.
        fenced = [f for f in report.faults if f.kind == "SIGSTOP in ack"]
        assert fenced, "no worker was stopped inside its outcome transaction"
        for fault in fenced:
            assert fault.until is not None and fault.recovery is not None, fault
            assert fault.at + fault.recovery < fault.until - 1.0, (
                f"its partitions resumed only {fault.recovery:.1f}s after the stop, at SIGCONT: the frozen "
                f"transaction kept its locks ({fault})"
            )
        conn_kills = [f for f in report.faults if f.kind == "connection kill"]
        assert conn_kills and any(not f.detail.endswith("x0") for f in conn_kills), conn_kills
        for fault in report.faults:
            if fault.recovery is not None:
                assert fault.recovery < RECOVERY_BOUND, fault

        assert report.problems == [] and report.late_unfenced == []

        # The hung handler: given up after its timeout, dead-lettered after max_attempts
        # (2), its worker's other partitions going on meanwhile.
        assert "timeout" in inspect.signature(consumer).parameters, (
            "@consumer has no timeout= yet (issue 14 item 1): a hung handler stalls its worker's partitions"
        )
        hung = [f for f in report.faults if f.kind == "hung handler"]
        assert hung, "the hung message was never delivered"
        assert hung[0].recovery is not None and hung[0].recovery < HUNG_BOUND, hung[0]
        dead = [d for d in report.hung["dead_letters"] if d[0] == f"{HANG_GROUP}:{HUNG_ID}"]
        assert dead, f"the hung message is not in the {HANG_GROUP} group's dead letters: {report.hung}"
        assert len(report.hung["attempts"]) == 2, report.hung
        assert "tim" in dead[0][2].lower(), f"the dead letter's error does not say it timed out: {dead[0][2]}"
        failed = False
    finally:
        if failed:
            print(f"chaos run directory kept: {run.directory}")
            for process in run.supervisor.every[-6:]:
                print(f"----- {process.name} (pid {process.pid}) log, last 3000 characters -----")
                print(process.log()[-3000:])
            print("----- server log -----")
            print(run.server.log_tail())
        run.cleanup(keep=failed or bool(os.environ.get("CHAOS_KEEP")))
