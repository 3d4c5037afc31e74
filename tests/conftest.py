"""Fixtures shared by the test files."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture()
def load_tool(monkeypatch):
    """``load_tool("bench_rewrite")``: a script of tools/ imported as a module for this test only."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"{name}_under_test", TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    return load
