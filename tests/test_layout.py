"""The package's shape, read from the source with ``ast`` (no database, no Django setup).

- Tests mirror the package: every module of ``django_sqlqueue`` is imported by a test module
  in ``tests/<its folder>/`` (``management/commands/`` by ``tests/management/``), so its tests
  are found next to each other and a module nobody tests stands out.
- Sizes: at most 20 modules at the package root, no module over 400 lines, no class over 300
  (migrations aside; a module's lines are its newlines, a class's ``end_lineno - lineno + 1``
  with its docstring: issue 27's measure).
- Every package folder says what it is for: a module docstring in its ``__init__.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_sqlqueue"
TESTS = ROOT / "tests"

#: Old import paths kept for users (docs name them): three-line re-exports, tested where they point.
SHIMS = {"dlq.py", "outage.py", "sequencer.py"}
MAX_ROOT_MODULES = 20
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300


def package_modules() -> Iterator[Path]:
    """Every ``.py`` file of the package, migrations aside."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" not in path.relative_to(PACKAGE).parts:
            yield path


def dotted(path: Path) -> str:
    """``django_sqlqueue/ops/seek.py`` -> ``django_sqlqueue.ops.seek``."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def mirror(path: Path) -> Path:
    """The test folder of a module: ``tests/`` plus its folder in the package.

    The management commands are tested in ``tests/management/``: ``tests/management/commands/``
    would hold nothing else.
    """
    folder = path.parent.relative_to(PACKAGE)
    if folder.parts[:2] == ("management", "commands"):
        folder = Path("management")
    return TESTS / folder


@cache
def imported_by(test_module: Path) -> frozenset[str]:
    """The dotted names a test module imports, wherever the import sits (tests import in functions).

    ``import a.b.c`` gives ``a.b.c``; ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (``c``
    may be a module or a name in ``a.b``: :func:`test_every_module_is_imported_by_its_mirrored_tests`
    only asks about modules). Relative imports are the tests' own helpers.
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(test_module.read_text(), str(test_module))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


def test_every_module_is_imported_by_its_mirrored_tests() -> None:
    untested = []
    for path in package_modules():
        if path.name == "__init__.py" or (path.parent == PACKAGE and path.name in SHIMS):
            continue
        folder = mirror(path)
        if not any(dotted(path) in imported_by(test) for test in sorted(folder.glob("test_*.py"))):
            untested.append(f"{dotted(path)} (in {folder.relative_to(ROOT)}/)")
    assert not untested, "modules no test module of their mirrored folder imports:\n  " + "\n  ".join(untested)


def test_the_package_root_holds_at_most_20_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, f"{len(modules)} modules at the package root: {modules}"


def test_no_module_over_400_lines_and_no_class_over_300() -> None:
    oversize = []
    for path in package_modules():
        source = path.read_text()
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES:
            oversize.append(f"module {dotted(path)}: {lines} lines")
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1  # docstrings included
                if length > MAX_CLASS_LINES:
                    oversize.append(f"class {dotted(path)}.{node.name} (line {node.lineno}): {length} lines")
    assert not oversize, "over the size limits:\n  " + "\n  ".join(oversize)


def test_every_package_folder_has_a_module_docstring() -> None:
    bare = [
        str(init.parent.relative_to(ROOT))
        for init in package_modules()
        if init.name == "__init__.py" and not ast.get_docstring(ast.parse(init.read_text(), str(init)))
    ]
    assert not bare, "package folders whose __init__.py has no docstring: " + ", ".join(bare)
