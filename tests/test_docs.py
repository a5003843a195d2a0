"""The documentation a newcomer follows: its links lead somewhere, and its tables are complete.

README.md was split into docs/ pages (issue 29); these tests keep a moved section from
leaving a dead link behind, and the settings table from missing a setting again (it
lacked ``SCHEDULES``). The tutorial's steps themselves are run by ``bash .ci/tutorial``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from django_sqlqueue.conf import QueueSettings

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of ``page``: its headings (lower case, punctuation dropped, spaces as
    hyphens) and its explicit ``<a id=...>``."""
    text = FENCE.sub("", page.read_text())
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found | set(re.findall(r'<a (?:id|name)="([^"]+)"', text))


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no file {destination.relative_to(ROOT)}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(ROOT)}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_settings_page_lists_every_setting() -> None:
    page = (ROOT / "docs" / "settings.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)`", page, re.M)) | set(re.findall(r"^\| `\w+` / `(\w+)`", page, re.M))
    missing = [f.name for f in dataclasses.fields(QueueSettings) if f.name not in rows]
    assert not missing, f"docs/settings.md has no row for {missing}"


def test_the_readme_shows_install_publish_consume_console_and_test_first() -> None:
    readme = (ROOT / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", FENCE.sub("", readme), re.M)
    first = headings[:6]
    assert first == ["Install", "Add it to your project", "Publish", "Consume", "The operator's console", "Test"]
    # The repository's own scripts come after all of that.
    assert headings.index("Try the demo from a clone") > 5
