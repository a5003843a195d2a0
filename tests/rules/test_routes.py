"""Routing topics to database aliases (rules/routes.py): pure functions of the setting."""

from __future__ import annotations

import pytest

from django_sqlqueue.rules.routes import aliases, route, route_problems

ROUTES = {"orders.*": "orders", "orders.eu.*": "eu", "billing": "billing", "*.audit": "audit"}


@pytest.mark.parametrize(
    ("topic", "alias"),
    [
        ("orders.created", "orders"),
        ("orders.eu.paid", "eu"),  # more specific pattern wins, whatever the dict order
        ("billing", "billing"),
        ("billing.x", "default"),  # an exact name is no prefix
        ("emails", "default"),
        ("orders", "default"),  # "orders.*" needs the dot
        ("orders.created.dlq", "orders"),  # a dead-letter topic lives with its topic
        ("billing.dlq", "billing"),
        ("x.audit", "audit"),
        ("orders.audit", "orders"),  # "orders.*" has more fixed characters than "*.audit"
    ],
)
def test_route_picks_the_most_specific_pattern(topic: str, alias: str) -> None:
    assert route(topic, ROUTES, "default", ".dlq") == alias
    assert route(topic, dict(reversed(list(ROUTES.items()))), "default", ".dlq") == alias


def test_no_routes_is_the_default_alias() -> None:
    assert route("anything", {}, "queue", ".dlq") == "queue"


def test_aliases_lists_the_default_first_without_duplicates() -> None:
    assert aliases(ROUTES | {"x": "default"}, "default") == ["default", "orders", "eu", "billing", "audit"]


def test_route_problems_name_the_bad_entry() -> None:
    dbs = {"default": {}, "orders": {}}
    assert route_problems({"orders.*": "orders"}, dbs) == []
    assert "must be a dict" in route_problems(["orders"], dbs)[0]
    (msg,) = route_problems({"orders.*": "nope"}, dbs)
    assert "'nope'" in msg and "settings.DATABASES" in msg
    (msg,) = route_problems({"bad topic": "orders"}, dbs)
    assert "not a topic pattern" in msg
    (msg,) = route_problems({7: "orders"}, dbs)
    assert "not a topic pattern" in msg
