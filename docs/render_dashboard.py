"""Draw docs/dashboard.png from the Grafana dashboard's own queries on a real run (a pytest module, run on purpose):

    DATABASE_URL=mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_dashboard \\
        .venv/bin/python -m pytest -q -s -p no:cacheprovider docs/render_dashboard.py

Grafana is not installable here, so this draws what it would: a real Prometheus (Debian's
``prometheus``, the fixture of tests/metrics/test_prometheus.py) scrapes the queue gauges
view and two real ``runconsumer --metrics-port`` processes (groups g1 and g2 of the tests'
``proc.events`` consumers) for about three minutes of scripted load: a warm-up, a busier phase
with slower handlers, first-attempt failures (retried) and rejected messages (dead letters),
then g2 paused for 40 s (its lag and lag in seconds rise) and resumed (they fall), then a
trickle. Each panel of docs/grafana/sqlqueue-dashboard.json's two main rows is then read
with ``/api/v1/query_range`` (variables: every group and topic, ``$__rate_interval`` = 10 s)
and drawn with matplotlib in Grafana's dark theme. Needs matplotlib (the ``spark`` extra).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.test import override_settings

from django_sqlqueue import ops, publish_many
from django_sqlqueue.metrics import views
from tests.conftest import runconsumer  # noqa: F401 (a fixture)
from tests.metrics.test_dashboard import DASHBOARD, INTERNALS_ROW, panels
from tests.metrics.test_prometheus import TOKEN, prometheus  # noqa: F401 (a fixture)
from tests.processes.test_metrics import answers, free_port
from tests.support.processes import wait_until

DOCS = Path(__file__).resolve().parent
STEP = 2  # seconds between the points of query_range
VARIABLES = {"group": ".*", "topic": ".*", "__rate_interval": "10s"}
#: (seconds, messages per second, what happens) of the scripted load.
PHASES = [(40, 6, "warm-up"), (40, 15, "busy"), (40, 10, "g2 paused"), (40, 10, "g2 resumed"), (30, 3, "trickle")]
#: RENDER_SPEED=0.2 runs the phases 5 times faster (a quick try of the script).
PHASES = [(seconds * float(os.environ.get("RENDER_SPEED", "1")), rate, phase) for seconds, rate, phase in PHASES]

# Grafana's dark theme and its classic palette.
BACKGROUND, PANEL, GRID, TEXT = "#111217", "#181b1f", "#2c3235", "#ccccdc"
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"]


def payload(rng: random.Random, phase: str) -> dict:
    script: dict = {"sleep": rng.choice((0.002, 0.005, 0.01, 0.02)) if phase != "busy" else rng.uniform(0.005, 0.06)}
    roll = rng.random()
    if phase in ("busy", "g2 paused") and roll < 0.04:
        script["fail_first"] = ["g1", "g2"]  # retried once, then handled
    elif phase == "busy" and roll < 0.06:
        script["reject"] = ["g1"]  # a dead letter of g1
    return script


def publisher(stop: threading.Event, marks: list[tuple[float, str]]) -> None:
    rng = random.Random(15)
    n = 0
    for seconds, rate, phase in PHASES:
        marks.append((time.time(), phase))
        if phase == "g2 paused":
            ops.pause("g2", "proc.events", reason="render_dashboard")
        if phase == "g2 resumed":
            ops.resume("g2", "proc.events")
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            batch = max(1, rate // 3)
            publish_many(
                "proc.events",
                [{"payload": payload(rng, phase), "key": f"k{(n + i) % 16}"} for i in range(batch)],
            )
            n += batch
            stop.wait(batch / rate)
    marks.append((time.time(), "end"))


def substitute(expr: str) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: VARIABLES[m.group(1) or m.group(2)], expr)


def query_range(port: int, expr: str, start: float, end: float) -> list[dict]:
    params = {"query": substitute(expr), "start": start, "end": end, "step": STEP}
    url = f"http://127.0.0.1:{port}/api/v1/query_range?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def draw(port: int, start: float, end: float, marks: list[tuple[float, str]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    dashboard = json.loads(DASHBOARD.read_text())
    shown = [(row, p) for row, p in panels(dashboard) if not row.startswith(INTERNALS_ROW)]
    rows = (len(shown) + 1) // 2
    plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 8})
    fig, axes = plt.subplots(rows, 2, figsize=(14, 3.0 * rows), facecolor=BACKGROUND, squeeze=False)
    units = {"s": "seconds", "ops": "per second", "short": ""}
    for ax, (_, panel) in zip(axes.flat, shown, strict=False):
        ax.set_facecolor(PANEL)
        color = iter(PALETTE * 4)
        for target in panel["targets"]:
            for series in query_range(port, target["expr"], start, end):
                xs = [dt.datetime.fromtimestamp(float(t)) for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                label = legend(target.get("legendFormat", ""), series["metric"])
                ax.plot(xs, ys, lw=1.3, color=next(color), label=label)
        for at, phase in marks[1:-1]:
            ax.axvline(dt.datetime.fromtimestamp(at), color="#5c6370", lw=0.7, ls=":")
            ax.text(dt.datetime.fromtimestamp(at), 1.0, f" {phase}", transform=ax.get_xaxis_transform(),
                    color="#8e8e8e", fontsize=6.5, va="top")  # fmt: skip
        ax.set_title(panel["title"], color=TEXT, loc="left", fontsize=9.5, fontweight="bold")
        ax.set_ylabel(units.get(panel["fieldConfig"]["defaults"].get("unit", ""), ""), color="#8e8e8e")
        ax.set_xlim(dt.datetime.fromtimestamp(start), dt.datetime.fromtimestamp(end))
        ax.set_ylim(bottom=0)
        ax.grid(color=GRID, lw=0.6)
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        for spine in ax.spines.values():
            spine.set_color(GRID)
        if any(not line.get_label().startswith("_") for line in ax.lines):
            ax.legend(loc="best", fontsize=6.5, facecolor=PANEL, edgecolor=GRID, labelcolor=TEXT, ncol=2)
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"{dashboard['title']}: the queries of docs/grafana/sqlqueue-dashboard.json on a real Prometheus "
        "(gauges view + 2 runconsumer processes, scripted load), drawn with matplotlib",
        color=TEXT,
        fontsize=10,
        x=0.01,
        ha="left",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=110, facecolor=BACKGROUND)


@pytest.mark.skipif(not os.environ.get("DATABASE_URL"), reason="run on purpose with a DATABASE_URL (see the docstring)")
@pytest.mark.django_db(transaction=True)
def test_render_dashboard(prometheus, live_server, runconsumer):  # noqa: F811 (the fixtures)
    start_prometheus, _ = prometheus
    views.clear_cache()
    ports = {"g1": free_port(), "g2": free_port()}
    with override_settings(
        SQLQUEUE={"TOPICS": {}, "METRICS_TOKEN": TOKEN, "LEASE_DURATION": 3, "LEASE_RENEW_INTERVAL": 0.5}
    ):
        args = ["--topic", "proc.events", "--metrics-addr", "127.0.0.1"]
        workers = [
            runconsumer(f"render-{group}", "--group", group, "--metrics-port", str(port), *args, verbosity="1")
            for group, port in ports.items()
        ]
        for worker, port in zip(workers, ports.values(), strict=True):
            wait_until(lambda p=port: answers(p), 30, "a worker's metrics port answers", show=worker.log)
        port = start_prometheus(
            [
                {
                    "job_name": "sqlqueue",
                    "metrics_path": "/sqlqueue/metrics",
                    "authorization": {"type": "Bearer", "credentials": TOKEN},
                    "static_configs": [{"targets": [urllib.parse.urlsplit(live_server.url).netloc]}],
                },
                {
                    "job_name": "sqlqueue-workers",
                    "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}],
                },
            ]
        )
        begin = time.time()
        marks: list[tuple[float, str]] = []
        stop = threading.Event()
        thread = threading.Thread(target=publisher, args=(stop, marks), daemon=True)
        thread.start()
        thread.join(sum(p[0] for p in PHASES) + 60)
        stop.set()
        time.sleep(5)  # the last scrapes after the trickle
        draw(port, begin, time.time(), marks, DOCS / "dashboard.png")
        for worker in workers:
            assert worker.terminate() == 0
    print(f"wrote {DOCS / 'dashboard.png'}")
