"""A factory's import path: ``package.module:function`` loaded as documented, refused otherwise."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from common.import_paths import load_callable

FACTORIES = """
class Outer:
    class Inner:
        @staticmethod
        def make():
            return "made"

NOT_CALLABLE = 3
"""


@pytest.fixture
def factories(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "rlfleet_paths_factories.py").write_text(FACTORIES)
    (tmp_path / "rlfleet_paths_broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "rlfleet_paths_factories"


def test_a_module_function_and_a_nested_attribute_load(factories: str) -> None:
    assert load_callable("os:getcwd") is os.getcwd
    assert load_callable(f"{factories}:Outer.Inner.make")() == "made"


@pytest.mark.parametrize("spec", [None, 42, b"os:getcwd", ["os:getcwd"]])
def test_a_spec_that_is_not_a_string_is_refused_with_the_expected_form(spec: object) -> None:
    with pytest.raises(ValueError, match=r"expected 'package\.module:function'"):
        load_callable(spec)


@pytest.mark.parametrize(
    "spec", ["os", "os:", ":getcwd", "os:getcwd:x", "os:get cwd", "os:getcwd.", "1os:getcwd"]
)
def test_a_malformed_spec_is_refused_with_the_expected_form(spec: str) -> None:
    with pytest.raises(ValueError, match=r"expected 'package\.module:function'"):
        load_callable(spec)


def test_a_module_that_raises_at_import_is_refused_as_a_value_error(factories: str) -> None:
    with pytest.raises(ValueError, match=r"cannot import module 'rlfleet_paths_broken'.*boom"):
        load_callable("rlfleet_paths_broken:make")


@pytest.mark.parametrize(("body", "raised"), [("raise SystemExit(0)", "SystemExit(0)")])
def test_a_module_that_exits_at_import_is_refused_as_a_value_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, body: str, raised: str
) -> None:
    (tmp_path / "rlfleet_paths_exiting.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ValueError, match=rf"cannot import module 'rlfleet_paths_exiting'.*{re.escape(raised)}"
    ):
        load_callable("rlfleet_paths_exiting:make")


def test_a_missing_module_or_attribute_is_refused_naming_it(factories: str) -> None:
    with pytest.raises(ValueError, match="cannot import module 'rlfleet_no_such_module'"):
        load_callable("rlfleet_no_such_module:make")
    with pytest.raises(ValueError, match=r"has no attribute 'Outer\.Missing'"):
        load_callable(f"{factories}:Outer.Missing")


def test_an_attribute_that_is_not_callable_is_refused(factories: str) -> None:
    with pytest.raises(ValueError, match="names a int, not a callable"):
        load_callable(f"{factories}:NOT_CALLABLE")
