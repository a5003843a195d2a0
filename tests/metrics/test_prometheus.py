"""A real Prometheus server (Debian's ``prometheus``) scrapes both endpoints; PromQL sees lag rise and fall.

The test starts its own server on a free port with a 1 s scrape interval and a temporary
TSDB: one job scrapes the queue gauges view (pytest-django's ``live_server``, with the Bearer
token), one a real ``runconsumer --metrics-port``. CI installs the package (``.ci/lib.sh``
``ensure_prometheus``) and sets ``SQLQUEUE_CI_PROMETHEUS=1``, so there a missing binary fails
instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.test import override_settings

from django_sqlqueue import ops, publish_many
from django_sqlqueue.metrics import views
from django_sqlqueue.models import PartitionLease

from ..processes.test_metrics import answers
from ..support.ports import free_port
from ..support.processes import wait_until

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
TOKEN = "prometheus-scrapes-with-this-token"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(PROMETHEUS) and not os.environ.get("SQLQUEUE_CI_PROMETHEUS"),
        reason="the prometheus binary is not installed (apt-get install prometheus; .ci/run installs it)",
    ),
]


def query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def scalar(port: int, promql: str) -> float | None:
    result = query(port, promql)
    return float(result[0]["value"][1]) if result else None


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def prometheus(tmp_path: Path):
    """Start ``prometheus`` with the scrape config (and rule files) a test gives; yield (start, log); stop it."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    log = tmp_path / "prometheus.log"

    def start(scrape_configs: list[dict], rule_files: list[str] | None = None) -> int:
        config = tmp_path / "prometheus.yml"
        # JSON is YAML: no yaml dependency needed.
        settings = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape_configs}
        if rule_files:
            settings["rule_files"] = rule_files
        config.write_text(json.dumps(settings))
        with log.open("w") as out:
            procs.append(
                subprocess.Popen(
                    [
                        PROMETHEUS,
                        f"--config.file={config}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        wait_until(lambda: ready(port), 30, "prometheus is ready", show=log.read_text)
        return port

    yield start, log
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.django_db(transaction=True)
def test_prometheus_scrapes_both_endpoints_and_sees_lag_rise_and_fall(prometheus, live_server, runconsumer):
    start, log = prometheus
    views.clear_cache()
    worker_port = free_port()
    with override_settings(
        SQLQUEUE={"TOPICS": {}, "METRICS_TOKEN": TOKEN, "LEASE_DURATION": 3, "LEASE_RENEW_INTERVAL": 0.5}
    ):
        worker = runconsumer(
            "prom",
            "--group",
            "g1",
            "--topic",
            "proc.events",
            "--metrics-port",
            str(worker_port),
            "--metrics-addr",
            "127.0.0.1",
        )
        wait_until(lambda: answers(worker_port), 30, "the worker's metrics port answers", show=worker.log)
        server = urllib.parse.urlsplit(live_server.url).netloc
        port = start(
            [
                {
                    "job_name": "sqlqueue",
                    "metrics_path": "/sqlqueue/metrics",
                    "authorization": {"type": "Bearer", "credentials": TOKEN},
                    "static_configs": [{"targets": [server]}],
                },
                {"job_name": "worker", "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
            ]
        )
        lag = 'sum(sqlqueue_consumergroup_lag{group="g1",topic="proc.events"})'
        # Both targets are up (the view accepted the token).
        wait_until(
            lambda: scalar(port, 'sum(up{job=~"sqlqueue|worker"})') == 2, 30, "both targets up", show=log.read_text
        )
        wait_until(lambda: scalar(port, lag) == 0, 30, "lag 0 scraped", show=log.read_text)
        ops.pause("g1", "proc.events")
        # The worker notices the pause at its next lease round and gives its leases back;
        # until then it would consume what is published (the lag would never reach 20).
        wait_until(
            lambda: not PartitionLease.objects.filter(consumer_group="g1", topic="proc.events").exists(),
            30,
            "the worker released its leases on the pause",
            show=worker.log,
        )
        publish_many("proc.events", [{"payload": {"n": i}, "key": f"k{i}"} for i in range(20)])
        wait_until(
            lambda: scalar(port, lag) == 20,
            30,
            "PromQL sees the lag rise to 20",
            show=lambda: (query(port, lag), query(port, "up"), worker.log()[-1500:]),
        )
        assert scalar(port, 'sqlqueue_consumergroup_paused{group="g1",topic="proc.events"}') == 1
        ops.resume("g1", "proc.events")
        wait_until(lambda: scalar(port, lag) == 0, 60, "PromQL sees the lag fall to 0", show=worker.log)
        processed = 'sum(sqlqueue_messages_processed_total{group="g1",topic="proc.events"})'
        wait_until(lambda: scalar(port, processed) == 20, 30, "PromQL sees 20 processed by the worker")
        # The rise and the fall are both in the stored series.
        assert scalar(port, f"max_over_time({lag}[2m:1s])") == 20
        assert worker.terminate() == 0
