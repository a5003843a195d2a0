"""One owner per table: only the data layer (``django_sqlqueue/db/``) writes SQL against the
queue tables or writes them through the ORM (docs/design.md, "Where the code lives").

Read with ``ast`` over the package's source, no database: a SQL statement in a string
literal, a ``cursor.execute``, or an ORM write (``delete``, ``update``, ``create``,
``bulk_create``, ``save``, ``select_for_update`` ...) on a queue model outside ``db/``
fails, naming the file and line. SQL keywords are matched in capitals, as the package
writes them. Two tables have their owner elsewhere, by design: the
tasks backend's results (``queue_task_results``, owned by ``tasks/results.py``) and the
admin's audit rows (Django's own ``LogEntry``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "django_sqlqueue"
DATA_LAYER = PACKAGE / "db"

SQL = re.compile(
    r"\b(SELECT\b[\s\S]+\bFROM|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|FOR\s+UPDATE|LOCK\s+IN\s+SHARE"
    r"|LISTEN\s|NOTIFY\s|set_config\s*\(|START\s+TRANSACTION)"
)
EXECUTE = {"execute", "executemany", "executescript"}
ORM_WRITES = {
    "delete",
    "update",
    "create",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
    "select_for_update",
    "save",
}
QUEUE_MODELS = {
    "Message",
    "Topic",
    "Partition",
    "DeliveryState",
    "PartitionLease",
    "ConsumerOffset",
    "SubscriberHeartbeat",
    "PausedTopic",
    "TopicHour",
    "ScheduleState",
    "TaskResultRecord",
}
#: model -> the one module outside db/ that owns its writes.
OWNERS = {"TaskResultRecord": PACKAGE / "tasks" / "results.py"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts and DATA_LAYER not in p.parents)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _chain_names(node: ast.AST) -> set[str]:
    """Every name and attribute in a call chain such as ``Message.objects.using(x).filter(...).delete()``."""
    names = set()
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            if isinstance(node, ast.Name):
                names.add(node.id)
            return names


def findings(path: Path, source: str | None = None) -> list[str]:
    """What ``path`` (or ``source`` read as that module) does that only the data layer may do,
    as "file:line: what" strings."""
    tree = ast.parse(path.read_text() if source is None else source)
    skip = _docstrings(tree)
    where = path.relative_to(PACKAGE.parent)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if SQL.search(node.value):
                found.append(f"{where}:{node.lineno}: SQL literal {node.value[:60]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in EXECUTE:
                found.append(f"{where}:{node.lineno}: .{node.func.attr}()")
            elif node.func.attr in ORM_WRITES:
                models = _chain_names(node.func.value) & QUEUE_MODELS
                if "objects" in _chain_names(node.func.value) or node.func.attr == "save":
                    models |= {m for m in QUEUE_MODELS if m in ast.unparse(node.func.value)}
                for model in sorted(models):
                    if OWNERS.get(model) != path:
                        found.append(f"{where}:{node.lineno}: ORM {node.func.attr}() on {model}")
    return found


def test_only_the_data_layer_writes_the_queue_tables() -> None:
    found = [f for path in _modules() for f in findings(path)]
    assert not found, "outside django_sqlqueue/db/:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source, expected",
    [
        ('X = "SELECT seq FROM queue_messages WHERE topic = %s"', "SQL literal"),
        ('def f(c):\n    c.execute("x")', ".execute()"),
        ("def f(u):\n    Message.objects.using(u).filter(seq=1).delete()", "ORM delete() on Message"),
        ("def f(u):\n    list(DeliveryState.objects.using(u).select_for_update())", "ORM select_for_update() on"),
        ('def f():\n    """SELECT is fine in a docstring."""\n    return Message.objects.filter(seq=1)', None),
    ],
)
def test_the_check_finds_what_it_looks_for(source: str, expected: str | None) -> None:
    """The check itself can fail: each kind of statement is found in a module outside db/."""
    found = findings(PACKAGE / "ops" / "probe.py", source)
    if expected is None:
        assert found == []
    else:
        assert any(expected in f for f in found), found
