"""The chaos suite runs only when asked for: ``pytest -m chaos tests/chaos``.

Its tests are deselected unless the ``-m`` expression names ``chaos`` (``-m chaos``,
``-m "chaos and not slow"``...), so the ordinary runs of the suite (``pytest``, ``-m slow``,
``-m "not slow"``) never start its private servers. Each run's report is printed in the
terminal summary, captured output or not.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

REPORTS = pytest.StashKey[list[str]]()


def chaos_selected(config: pytest.Config) -> bool:
    return re.search(r"\bchaos\b", config.option.markexpr or "") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if chaos_selected(config):
        return
    deselected = [item for item in items if item.get_closest_marker("chaos") is not None]
    if deselected:
        items[:] = [item for item in items if item.get_closest_marker("chaos") is None]
        config.hook.pytest_deselected(items=deselected)


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Call with a run's report text: printed now and again in the terminal summary."""

    def add(text: str) -> None:
        print(text)
        request.config.stash.setdefault(REPORTS, []).append(text)

    return add


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    reports = config.stash.get(REPORTS, [])
    if reports:
        terminalreporter.section("chaos reports")
        for text in reports:
            terminalreporter.write_line(text)
            terminalreporter.write_line("")
