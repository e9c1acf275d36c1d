"""The flag helper every command declares its flags with (``stoker.flags``): one declaration
makes the parser in either style, the checks and the values written back."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from stoker.errors import FlagError
from stoker.flags import DefaultsHelpFormatter, add_flags, check_values, field_flags, given_values, option


@dataclass(kw_only=True)
class Settings:
    steps: int | None = option(None, "batches", minimum=1, default_text="all")
    port: int = option(8000, "port", minimum=0, maximum=65535)
    rate: float = option(0.5, "a fraction", above=0, maximum=1)
    order: str = option("newest", "which first", choices=("newest", "oldest"))
    verbose: bool = option(False, "say more")
    batching: bool = option(True, "batch requests")
    sizes: tuple[int, ...] = option((), "sizes", minimum=1, default_text="none")
    paths: list[str] | None = option(None, "files", nargs="+", metavar="PATH")


def parser(style: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="x", formatter_class=DefaultsHelpFormatter, exit_on_error=False)
    add_flags(p, field_flags(Settings), style=style)  # type: ignore[arg-type]
    return p


def test_the_argparse_style_gives_defaults_argparse_booleans_and_lists_of_values() -> None:
    p = parser("argparse")
    assert given_values(Settings, p.parse_args([])) == {
        "steps": None, "port": 8000, "rate": 0.5, "order": "newest", "verbose": False, "batching": True,
        "sizes": (), "paths": None,
    }  # fmt: skip
    args = p.parse_args(["--steps", "3", "--verbose", "--no-batching", "--paths", "a", "b", "--port", "0"])
    assert (args.steps, args.verbose, args.batching, args.paths, args.port) == (3, True, False, ["a", "b"], 0)
    text = " ".join(p.format_help().split())
    assert "--port PORT port (default: 8000)" in text and "--paths PATH [PATH ...] files" in text
    assert "--batching, --no-batching batch requests (default: True)" in text


def test_the_absl_style_gives_only_what_was_given_and_absl_booleans() -> None:
    p = parser("absl")
    assert given_values(Settings, p.parse_args([])) == {}  # not given: the dataclass's default
    args = p.parse_args(["--verbose", "--nobatching", "--sizes=2,3", "--rate=0.25"])
    assert given_values(Settings, args) == {"verbose": True, "batching": False, "sizes": (2, 3), "rate": 0.25}
    assert p.parse_args(["--verbose=false"]).verbose is False
    assert "port; default: 8000" in " ".join(p.format_help().split())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"steps": 0}, "--steps must be an integer >= 1; got 0"),
        ({"port": 70000}, r"--port must be an integer in \[0, 65535\]; got 70000"),
        ({"rate": 0.0}, r"--rate must be in \(0, 1\]; got 0.0"),
        ({"order": "random"}, "--order='random' is not allowed; allowed values: newest, oldest"),
        ({"sizes": (2, 0)}, "--sizes: every value must be an integer >= 1; got 0"),
    ],
)
def test_a_value_outside_its_declaration_is_a_flag_error_naming_the_flag(values: dict, message: str) -> None:
    with pytest.raises(FlagError, match=message) as e:
        check_values(Settings(**values))
    assert e.value.flags == (next(iter(values)),)
    check_values(Settings())  # the defaults pass
