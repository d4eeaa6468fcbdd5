"""Naming rules: function, secret and environment variable names."""

from __future__ import annotations

import pytest

from relay.domain.errors import InvalidNameError
from relay.domain.names import (
    function_name_problem,
    is_valid_env_name,
    secret_name_problem,
    validate_secret_name,
)


@pytest.mark.parametrize(
    "name",
    ["user-events", "welcome_email", "jobs.v2", "a", "0", "9lives", "a" * 63, "a.b-c_d"],
)
def test_valid_function_names(name: str) -> None:
    assert function_name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("User Events", "lowercase"),
        ("hello/world", "lowercase"),
        (".hidden", "lowercase"),
        ("-dash", "lowercase"),
        ("_under", "lowercase"),
        ("Upper", "lowercase"),
        ("jobs.", "dot"),
        ("a" * 64, "at most 63"),
        ("", "empty"),
        ("tab\tname", "lowercase"),
        ("caf\u00e9", "lowercase"),
        ("name\n", "lowercase"),
    ],
)
def test_invalid_function_names_are_rejected_never_sanitized(name: str, reason: str) -> None:
    problem = function_name_problem(name)
    assert problem is not None
    assert reason in problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    "name", ["database-url", "api_key", "a", "v1.2", "-lead", "_x", "a" * 63, "0"]
)
def test_valid_secret_names(name: str) -> None:
    assert secret_name_problem(name) is None
    validate_secret_name(name)


@pytest.mark.parametrize(
    "name", ["", ".hidden", "trailing.", "Upper", "has space", "a/b", "a" * 64, "ünï"]
)
def test_invalid_secret_names(name: str) -> None:
    assert secret_name_problem(name) is not None
    with pytest.raises(InvalidNameError):
        validate_secret_name(name)


@pytest.mark.parametrize("name", ["API_URL", "_x", "a", "PATH2", "lower_case", "A1_B2"])
def test_valid_env_names(name: str) -> None:
    assert is_valid_env_name(name)


@pytest.mark.parametrize("name", ["", "1ABC", "A-B", "A B", "A.B", "É", "A\n"])
def test_invalid_env_names(name: str) -> None:
    assert not is_valid_env_name(name)


@pytest.mark.parametrize("name", ["abc-", "abc_", "a._b", "a..b", "a___b", "x-_y"])
def test_names_docker_refuses_as_an_image_are_invalid(name: str) -> None:
    problem = function_name_problem(name)
    assert problem is not None
    assert "Docker image" in problem


@pytest.mark.parametrize("name", ["a__b", "a--b", "a-b_c.d", "jobs.v2", "9lives"])
def test_separators_between_letters_and_digits_are_fine(name: str) -> None:
    assert function_name_problem(name) is None
