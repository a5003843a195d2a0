"""Run one benchmark script in two checkouts, interleaved, and compare them.

    .venv/bin/python bench/sidebyside.py --old /tmp/sqlqueue-6f277f5 --rounds 3 \\
        consume -- --modes warm --workers 2 --rate 1000 --seconds 10 --repeat 1 --skip-baseline

``--old`` is another checkout of the project (``git archive <commit> | tar -x -C DIR``);
``bench/<script>.py`` of each checkout runs with this interpreter, in its own directory, so
each measures its own engine against the same database. Rounds alternate the order (new,
old), (old, new), ... so that drift of the machine hits both alike. Each run writes its
``--json``; the table shows the median of the rounds per metric and new/old (for
latencies old/new: above 1.00 means the new checkout is no slower), and the median of the
paired ratios (each round's new against the old run next to it, which cancels the drift of
the machine between rounds). ``--report JSON`` prints the table of an earlier run.

Scripts: ``publish`` (``publish()`` and ``publish_many()`` msgs/s) and ``consume`` (drain
msgs/s per mode and worker count; latency p50/p99 per rate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: metric -> (value, higher is better)
Metrics = dict[str, tuple[float, bool]]


def publish_metrics(data: dict[str, Any]) -> Metrics:
    v = data["variants"]
    return {
        "publish() msgs/s": (v["publish_single"]["median"], True),
        "publish_many() msgs/s": (v["publish_batched"]["median"], True),
        "publish() / raw INSERT": (v["publish_single"]["ratio"], True),
        "publish_many() / raw multi-row INSERT": (v["publish_batched"]["ratio"], True),
    }


def consume_metrics(data: dict[str, Any]) -> Metrics:
    out: dict[str, list[float]] = {}
    better: dict[str, bool] = {}

    def add(name: str, value: Any, higher: bool) -> None:
        if value is not None:
            out.setdefault(name, []).append(float(value))
            better[name] = higher

    for r in data["drain"]:
        if r["impl"] == "queue":
            where = f"drain {r['mode']} x{r['workers']}"
            add(f"{where} msgs/s", r["msgs_per_s"], True)
            add(f"{where} msgs/s from 1st ack", r["msgs_per_s_from_first_ack"], True)
    for r in data["latency"]:
        if r.get("impl", "queue") == "queue":
            where = f"latency {r['rate']:g}/s"
            add(f"{where} p50 ms", r["p50_ms"], False)
            add(f"{where} p99 ms", r["p99_ms"], False)
    return {name: (statistics.median(values), better[name]) for name, values in out.items()}


EXTRACT = {"publish": publish_metrics, "consume": consume_metrics}


def run(root: Path, script: str, args: list[str], out: Path) -> Metrics:
    command = [sys.executable, str(root / "bench" / f"{script}.py"), *args, "--json", str(out)]
    print(f"$ (cd {root} && {' '.join(command)})", flush=True)
    subprocess.run(command, cwd=root, check=True, env={**os.environ, "PYTHONPATH": str(root)})
    return EXTRACT[script](json.loads(out.read_text()))


def table(results: dict[str, list[Metrics]]) -> tuple[str, dict[str, Any]]:
    """The comparison table (markdown) and its figures."""
    lines = [
        "| metric | new (median) | old (median) | new vs old | median of paired rounds | paired rounds |",
        "|---|---:|---:|---:|---:|---|",
    ]
    summary = {}
    for name in results["new"][0]:
        new = statistics.median(m[name][0] for m in results["new"] if name in m)
        old = statistics.median(m[name][0] for m in results["old"] if name in m)
        higher = results["new"][0][name][1]
        ratio = new / old if higher else old / new
        pairs = [
            (n[name][0] / o[name][0]) if higher else (o[name][0] / n[name][0])
            for n, o in zip(results["new"], results["old"], strict=True)
        ]
        paired = statistics.median(pairs)
        summary[name] = {"new": new, "old": old, "ratio": ratio, "paired": pairs, "paired_median": paired}
        lines.append(
            f"| {name} | {new:,.2f} | {old:,.2f} | **{ratio:.2f}** | {paired:.2f} | "
            f"{', '.join(f'{p:.2f}' for p in pairs)} |"
        )
    return "\n".join(lines), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every round's metrics here")
    parser.add_argument("--report", type=Path, help="only print the table of an earlier --json")
    parser.add_argument("script", nargs="?", choices=sorted(EXTRACT))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: arguments of the script")
    opts = parser.parse_args()
    if opts.report:
        print(table(json.loads(opts.report.read_text())["rounds"])[0])
        return
    if opts.old is None or opts.script is None:
        parser.error("--old and a script are required (or --report)")
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    roots = {"new": ROOT, "old": opts.old.resolve()}
    results: dict[str, list[Metrics]] = {"new": [], "old": []}
    load = []
    with tempfile.TemporaryDirectory(prefix="sidebyside-") as tmp:
        for i in range(opts.rounds):
            order = ["new", "old"] if i % 2 == 0 else ["old", "new"]
            for name in order:
                results[name].append(run(roots[name], opts.script, args, Path(tmp) / f"{name}-{i}.json"))
            load.append(os.getloadavg()[0])
    text, summary = table(results)
    print(f"\n{opts.script}: {opts.rounds} rounds, interleaved; load average after each round: {load}")
    print(f"new = {roots['new']}, old = {roots['old']}; new vs old >= 1.00: the new checkout is no slower\n")
    print(text)
    if opts.json:
        opts.json.write_text(json.dumps({"load": load, "summary": summary, "rounds": results}, indent=2))


if __name__ == "__main__":
    main()
