"""Table sizes and the markdown report of ``bench/growth.py``."""

from __future__ import annotations

from typing import Any

MIB = 1024 * 1024


def table_sizes() -> dict[str, dict[str, Any]]:
    """Bytes of data and of each index per queue table.

    MariaDB: the table's ``.ibd`` file (``INNODB_SYS_TABLESPACES``, exact) and the per-index
    page counts of ``mysql.innodb_index_stats`` (refreshed by InnoDB's automatic statistics,
    not by an ``ANALYZE``: none runs). PostgreSQL: ``pg_relation_size`` (exact).
    """
    from django.db import connection

    out: dict[str, dict[str, Any]] = {}
    with connection.cursor() as c:
        if connection.vendor == "mysql":
            c.execute(
                "SELECT SUBSTRING_INDEX(name, '/', -1), file_size FROM information_schema.INNODB_SYS_TABLESPACES "
                "WHERE name LIKE CONCAT(DATABASE(), '/queue\\_%%')"
            )
            for table, size in c.fetchall():
                out[table] = {"file_bytes": int(size), "indexes": {}}
            c.execute(
                "SELECT table_name, index_name, stat_value * @@innodb_page_size FROM mysql.innodb_index_stats "
                "WHERE database_name = DATABASE() AND stat_name = 'size' AND table_name LIKE 'queue\\_%%'"
            )
            for table, index, size in c.fetchall():
                out.setdefault(table, {"indexes": {}})["indexes"][index] = int(size)
        else:
            c.execute(
                "SELECT c.relname, pg_relation_size(c.oid) + COALESCE(pg_relation_size(c.reltoastrelid), 0) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname LIKE 'queue\\_%%'"
            )
            for table, size in c.fetchall():
                out[table] = {"data_bytes": int(size), "indexes": {}}
            c.execute(
                "SELECT t.relname, i.relname, pg_relation_size(i.oid) FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
                "JOIN pg_namespace n ON n.oid = t.relnamespace "
                "WHERE n.nspname = current_schema() AND t.relname LIKE 'queue\\_%%'"
            )
            for table, index, size in c.fetchall():
                out.setdefault(table, {"indexes": {}})["indexes"][index] = int(size)
    return {t: v for t, v in sorted(out.items()) if v.get("file_bytes", v.get("data_bytes", 0)) or v["indexes"]}


# -- the report -----------------------------------------------------------------------------


def _rows(run: dict[str, Any]) -> list[tuple[str, str, float | None]]:
    """(operation, unit, value) of one size; lower is better except for rates (msgs/s)."""
    p, c, g = run["publish"], run["consume"], {**run["gc"]}
    if not g["deleted"]:  # nothing to collect (the empty log): no GC figures
        g["publish_during_p99_ms"] = None
    rows: list[tuple[str, str, float | None]] = [
        ("publish() p50", "ms", p["publish_p50_ms"]),
        ("publish() p99", "ms", p["publish_p99_ms"]),
        ("publish_many (1,000/call)", "msgs/s", p["publish_many_msgs_per_s"]),
        ("drain, 2 runconsumer", "msgs/s", c["drain_msgs_per_s"]),
        (f"latency p50 at {c['latency_rate']:.0f}/s", "ms", c["latency_p50_ms"]),
        (f"latency p99 at {c['latency_rate']:.0f}/s", "ms", c["latency_p99_ms"]),
    ]
    for name, r in run["reads"].items():
        rows.append((f"{name}: first call", "ms", r["first_ms"]))
        rows.append((f"{name}: best / slowest", "ms", r["best_ms"]))
        rows.append((f"{name}: its statements (median call)", "ms", r.get("db_median_ms")))
    rows += [
        ("GC", "msgs/s", g["msgs_per_s"] if g["deleted"] else None),
        ("GC / publish_many", "x", g["vs_publish_many"] if g["deleted"] else None),
        ("GC longest statement (= transaction)", "ms", g["longest_statement_ms"]),
        ("publish() p99 before GC", "ms", g["publish_before_p99_ms"]),
        ("publish() p99 during GC", "ms", g["publish_during_p99_ms"] if g["deleted"] else None),
        ("publish() p99 during / before GC", "x", _ratio(g["publish_during_p99_ms"], g["publish_before_p99_ms"])),
    ]
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}".rstrip("0").rstrip(".")


def report(runs: list[dict[str, Any]]) -> str:
    """One markdown table: a column per size, and each size's ratio to the first (empty) one."""
    sizes = [r["size"] for r in runs]
    head = ["operation", "unit"]
    for i, n in enumerate(sizes):
        head.append(f"{n:,}")
        if i:
            head.append(f"x {sizes[0]:,}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    per_size = [_rows(r) for r in runs]
    reads = {name: [r["reads"][name] for r in runs] for name in runs[0]["reads"]}
    for k, (name, unit, _) in enumerate(per_size[0]):
        cells = [name, unit]
        for i, rows in enumerate(per_size):
            value = rows[k][2]
            text = _fmt(value)
            if name.endswith("best / slowest"):
                r = reads[name.rsplit(":", 1)[0]][i]
                text = f"{_fmt(r['best_ms'])} / {_fmt(r['slowest_ms'])}"
            cells.append(text)
            if i:
                base = per_size[0][k][2]
                ratio = value / base if value is not None and base else None
                cells.append("-" if ratio is None else f"{ratio:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *aims(runs)]
    lines += ["", "| table / index (MiB) | " + " | ".join(f"{n:,}" for n in sizes) + " |"]
    lines.append("|---|" + "---|" * len(sizes))
    names: list[tuple[str, str]] = []
    for r in runs:
        for table, v in r["sizes"].items():
            for key in ("", *v["indexes"]):
                if (table, key) not in names:
                    names.append((table, key))
    for table, index in names:
        # Tables under 1 MiB at every size, and the other tables' indexes, are in the JSON only.
        sizes_of = [r["sizes"].get(table, {}) for r in runs]
        if max(v.get("file_bytes", v.get("data_bytes", 0)) for v in sizes_of) < MIB:
            continue
        if index and table != "queue_messages":
            continue
        cells = [table if not index else f"  {table}.{index}"]
        for r in runs:
            v = r["sizes"].get(table, {"indexes": {}})
            size = v["indexes"].get(index) if index else v.get("file_bytes", v.get("data_bytes"))
            cells.append("-" if size is None else f"{size / MIB:,.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def aims(runs: list[dict[str, Any]]) -> list[str]:
    """Issue 32's aims, judged on the largest size against the first (empty) one."""
    if len(runs) < 2:
        return []
    base, big = runs[0], runs[-1]
    over = []
    for (name, unit, b), (_, _, v) in zip(_rows(base), _rows(big), strict=True):
        if name.startswith("GC") or "during" in name or "before GC" in name or name.endswith("first call"):
            continue
        if b is None or v is None or not b or not v:
            continue
        ratio = b / v if unit == "msgs/s" else v / b
        if ratio > 1.5:
            over.append(f"{name} {ratio:.2f}x")
    slow = [
        f"{name} {max(r['first_ms'], r['slowest_ms']) / 1000:.1f} s"
        for name, r in big["reads"].items()
        if max(r["first_ms"], r["slowest_ms"]) > 1000
    ]
    g = big["gc"]
    during = _ratio(g["publish_during_p99_ms"], g["publish_before_p99_ms"])
    return [
        f"Aims at {big['size']:,} (vs {base['size']:,}):",
        f"- within 1.5x of empty (best call; rates inverted): {'yes' if not over else 'no: ' + ', '.join(over)}",
        f"- no call over 1 s: {'yes' if not slow else 'no: ' + ', '.join(slow)}",
        f"- GC >= 3x publish_many: {g['vs_publish_many']}x",
        f"- no GC transaction over 1 s: longest {g['longest_statement_ms']:,.0f} ms",
        f"- publish() p99 during GC within 1.3x of before: {during}x",
    ]
