"""The Grafana dashboard and the alert rules of docs/ (issue 15 item 5) against a real Prometheus.

- ``promtool check rules`` accepts docs/prometheus/sqlqueue-alerts.yml, and ``promtool test
  rules`` passes its unit tests (sqlqueue-alerts.test.yml: each alert fires when it should,
  not before its ``for``, not for a paused group or a purge of dead letters);
- the dashboard JSON has the shape Grafana imports (datasource, group and topic variables)
  and every metric name in its queries and in the rules is one the code serves;
- a real Prometheus (Debian's ``prometheus``, tests/metrics/test_prometheus.py's fixture)
  loads the rules and scrapes the real gauges view and a real ``runconsumer --metrics-port``
  while messages run through; then every dashboard query, its variables substituted, runs
  through ``/api/v1/query``, the panels whose data must exist return series, and every rule
  evaluates without error.

CI installs the binaries (``.ci/lib.sh`` ``ensure_prometheus``) and sets
``SQLQUEUE_CI_PROMETHEUS=1``: there a missing binary fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.test import override_settings

from django_sqlqueue import publish_many
from django_sqlqueue.metrics import views
from django_sqlqueue.metrics.gauges import QueueCollector, Snapshot
from django_sqlqueue.metrics.worker import WorkerMetrics
from django_sqlqueue.ops.base import store

from ..processes.test_metrics import answers
from ..support.ports import free_port
from ..support.processes import wait_until
from .test_prometheus import PROMETHEUS, TOKEN, prometheus, query, scalar  # noqa: F401 (a fixture)

DOCS = Path(__file__).resolve().parents[2] / "docs"
DASHBOARD = DOCS / "grafana" / "sqlqueue-dashboard.json"
RULES = DOCS / "prometheus" / "sqlqueue-alerts.yml"
RULE_TESTS = DOCS / "prometheus" / "sqlqueue-alerts.test.yml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
MISSING = "the prometheus package is not installed (apt-get install prometheus; .ci/run installs it)"
NEEDS_BINARIES = pytest.mark.skipif(
    not (os.path.exists(PROMETHEUS) and os.path.exists(PROMTOOL)) and not os.environ.get("SQLQUEUE_CI_PROMETHEUS"),
    reason=MISSING,
)


#: Panels that must show data after messages ran through a worker.
MUST_HAVE_DATA = (
    "Consumer lag (messages)",
    "Lag (seconds)",
    "Throughput (messages/s)",
    "Handler duration p50 / p95 / p99",
    "Live subscribers",
    "Dead letters",
    "Retries, rejections, timeouts (per s)",
)

#: Grafana's variables as the test substitutes them: every database, group and topic, a 30 s rate window.
VARIABLES = {"database": ".*", "group": ".*", "topic": ".*", "__rate_interval": "30s"}


def panels(dashboard: dict) -> list[tuple[str, dict]]:
    """Every non-row panel with the title of the row it belongs to (collapsed rows hold theirs)."""
    out, row = [], ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            out += [(row, inner) for inner in panel.get("panels", [])]
        else:
            out.append((row, panel))
    return out


def substitute(expr: str) -> str:
    """Replace ``$name`` and ``${name}`` by :data:`VARIABLES`; fail on any other variable."""

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in VARIABLES, f"unknown dashboard variable ${name} in {expr}"
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (ours all start with ``sqlqueue_``; and ``up``)."""
    names = set(re.findall(r"\bsqlqueue_[a-z_]+", expr))
    if re.search(r"\bup\{", expr):
        names.add("up")
    return names


def served_names() -> set[str]:
    """Every sample name the code can serve: the gauges' families and the worker's, with suffixes."""
    names = {"up"}
    for family in QueueCollector(Snapshot(now=store().now())).collect():
        names.add(family.name)
    for family in WorkerMetrics().registry.collect():
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_is_importable():
    dashboard = load()
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["database"]["query"]["query"] == "label_values(sqlqueue_database_up, database)"
    for name in ("group", "topic"):
        assert variables[name]["query"]["query"].startswith("label_values(sqlqueue_consumergroup_lag")
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    ids = [p["id"] for p in dashboard["panels"] if p["type"] == "row"] + [p["id"] for _, p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    titles = {p["title"] for _, p in panels(dashboard)}
    assert set(MUST_HAVE_DATA) <= titles
    for _, panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            substitute(target["expr"])  # only known variables


@pytest.mark.django_db
def test_the_dashboard_reads_only_metrics_that_exist():
    served = served_names()
    for _row, panel in panels(load()):
        for target in panel["targets"]:
            unknown = metric_names(target["expr"]) - served
            assert not unknown, f"{panel['title']}: {target['expr']} reads {unknown}, which nothing serves"


@NEEDS_BINARIES
def test_promtool_accepts_the_alert_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


@NEEDS_BINARIES
def test_the_alert_rules_fire_as_their_unit_tests_say():
    result = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def rules(port: int) -> list[dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5) as response:
        body = json.loads(response.read())
    return [rule for group in body["data"]["groups"] for rule in group["rules"]]


def label_values(port: int, label: str, match: str) -> list[str]:
    url = f"http://127.0.0.1:{port}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": match})
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())["data"]


@pytest.mark.slow
@NEEDS_BINARIES
@pytest.mark.django_db(transaction=True)
def test_every_query_runs_against_a_real_prometheus(prometheus, live_server, runconsumer):  # noqa: F811
    start, log = prometheus
    views.clear_cache()
    worker_port = free_port()
    with override_settings(
        SQLQUEUE={"TOPICS": {}, "METRICS_TOKEN": TOKEN, "LEASE_DURATION": 3, "LEASE_RENEW_INTERVAL": 0.5}
    ):
        worker = runconsumer(
            "dash", "--group", "g1", "--topic", "proc.events", "--metrics-port", str(worker_port),
            "--metrics-addr", "127.0.0.1",
        )  # fmt: skip
        wait_until(lambda: answers(worker_port), 30, "the worker's metrics port answers", show=worker.log)
        port = start(
            [
                {
                    "job_name": "sqlqueue",  # the job names the rules assume
                    "metrics_path": "/sqlqueue/metrics",
                    "authorization": {"type": "Bearer", "credentials": TOKEN},
                    "static_configs": [{"targets": [urllib.parse.urlsplit(live_server.url).netloc]}],
                },
                {"job_name": "sqlqueue-workers", "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
            ],
            rule_files=[str(RULES)],
        )
        # 20 handled, 2 rejected (dead letters at once), 2 failing on their first attempt (retried).
        publish_many(
            "proc.events",
            [{"payload": {"n": i}, "key": f"k{i}"} for i in range(20)]
            + [{"payload": {"reject": ["g1"]}, "key": f"r{i}"} for i in range(2)]
            + [{"payload": {"fail_first": ["g1"]}, "key": f"f{i}"} for i in range(2)],
        )
        processed = 'sum(sqlqueue_messages_processed_total{job="sqlqueue-workers"})'
        wait_until(lambda: scalar(port, processed) == 22, 30, "Prometheus sees 22 processed", show=log.read_text)
        wait_until(
            lambda: scalar(port, 'sum(sqlqueue_dead_letters{group="g1",topic="proc.events"})') == 2,
            30,
            "the gauges view's two dead letters scraped",
        )
        assert label_values(port, "database", "sqlqueue_database_up") == ["default"]  # the $database variable
        assert "g1" in label_values(port, "group", "sqlqueue_consumergroup_lag")  # the $group variable
        assert "proc.events" in label_values(port, "topic", 'sqlqueue_consumergroup_lag{group=~".*"}')

        def data(expr: str) -> bool:
            return bool(query(port, expr))

        for _, panel in panels(load()):
            for target in panel["targets"]:
                expr = substitute(target["expr"])
                if panel["title"] in MUST_HAVE_DATA and "timed_out" not in expr and "rejected" not in expr:
                    wait_until(lambda e=expr: data(e), 15, f"{panel['title']}: {expr} returns series")
                else:
                    query(port, expr)  # valid PromQL: the API answers "success" (asserted in query())
        wait_until(
            lambda: (
                all(r["health"] == "ok" and r.get("lastEvaluation", "").startswith("2") for r in rules(port))
                and len(rules(port)) == 9
            ),
            15,
            "every alert rule evaluated without error",
            show=lambda: rules(port),
        )
        for rule in rules(port):
            query(port, rule["query"])
            assert metric_names(rule["query"]) <= served_names(), rule["query"]
        assert worker.terminate() == 0
