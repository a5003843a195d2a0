"""tasks/options.py: TASKS OPTIONS parsed, and every mistake listed for the backend's check.

Issue 29: an unknown key (a typo) is named with the nearest valid key and the valid ones;
an invalid value is reported with it, not hidden behind the first problem.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.tasks.options import (
    INVALID_SETTING,
    OPTION_KEYS,
    UNKNOWN_OPTION,
    configuration_problems,
    parse_options,
)


def test_each_unknown_key_is_named_with_the_nearest_valid_one() -> None:
    problems = configuration_problems("default", {"MAX_ATEMPTS": 3, "visibility_timeout": 5, "COLOUR": "red"})
    assert [(p.id, p.msg) for p in problems] == [
        (UNKNOWN_OPTION, "TASKS['default']['OPTIONS'] has an unknown key 'COLOUR'."),
        (UNKNOWN_OPTION, "TASKS['default']['OPTIONS'] has an unknown key 'MAX_ATEMPTS'."),
        (UNKNOWN_OPTION, "TASKS['default']['OPTIONS'] has an unknown key 'visibility_timeout'."),
    ]
    valid = f"Valid keys: {', '.join(sorted(OPTION_KEYS))}."
    assert [p.hint for p in problems] == [
        valid,  # nothing near
        f"Did you mean 'MAX_ATTEMPTS'? {valid}",
        f"Did you mean 'VISIBILITY_TIMEOUT'? {valid}",
    ]


def test_an_invalid_value_is_reported_next_to_the_unknown_keys() -> None:
    problems = configuration_problems("jobs", {"GROPU": "x", "BATCH_SIZE": 0})
    assert [p.id for p in problems] == [UNKNOWN_OPTION, INVALID_SETTING]
    assert problems[1].msg == "TASKS['jobs']['OPTIONS']['BATCH_SIZE'] must be a positive int, got 0."


@pytest.mark.parametrize(
    "options, message",
    [
        ([("MAX_ATTEMPTS", 3)], "must be a dict, not list"),
        ({"VISIBILITY_TIMEOUT": "30"}, "VISIBILITY_TIMEOUT'] must be a positive float, got '30'"),
        ({"STRICT": "yes"}, "STRICT'] must be True or False"),
        ({"GROUP": "has space"}, "group"),
        ({"ATOMIC": "always"}, "atomic must be True, False or 'batch'"),
    ],
)
def test_invalid_values_are_problems(options: Any, message: str) -> None:
    [problem] = configuration_problems("default", options)
    assert problem.id == INVALID_SETTING and message in problem.msg


def test_valid_options_have_no_problem_and_parse() -> None:
    options = {"MAX_ATTEMPTS": 5, "GROUP": "jobs", "TIMEOUT": {"default": 30}, "STRICT": True}
    assert configuration_problems("default", options) == []
    parsed = parse_options("default", options)
    assert (parsed.max_attempts, parsed.group, parsed.batch_size, parsed.timeout_for_queue("default")) == (
        5,
        "jobs",
        1,
        30,
    )


def test_parse_options_raises_the_first_problem_in_one_line() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown key 'MAX_ATEMPTS'\. Did you mean 'MAX_ATTEMPTS'\?"):
        parse_options("default", {"MAX_ATEMPTS": 3})
