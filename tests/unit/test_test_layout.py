"""The test suite's own layout: every test module lives in tests/unit/ or
tests/integration/ under a basename of its own (test folders have no __init__.py,
so pytest imports each module by its basename), and no test module imports another
test module or conftest.py: what tests share is in tests/helpers/ (`helpers.*`)
or is a conftest fixture."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from helpers import TESTS

KINDS = ("unit", "integration")


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def _top_level_imports(path: Path) -> set[str]:
    """The top-level name of every module `path` imports, at any depth (imports
    inside functions too): a test module is importable only by its basename."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_test_module_is_in_a_kind_folder_under_a_basename_of_its_own():
    modules = _test_modules()
    assert len(modules) > 50, TESTS
    misplaced = [
        str(p.relative_to(TESTS)) for p in modules if p.relative_to(TESTS).parts[0] not in KINDS
    ]
    assert misplaced == [], f"test modules outside tests/unit and tests/integration: {misplaced}"
    twice = sorted(name for name, n in Counter(p.name for p in modules).items() if n > 1)
    assert twice == [], f"basenames used twice (pytest imports modules by basename): {twice}"
    packages = [str(p.relative_to(TESTS)) for p in TESTS.rglob("__init__.py")]
    assert packages == ["helpers/__init__.py"], packages


def test_no_test_module_imports_another_test_module_or_conftest():
    forbidden = {p.stem for p in _test_modules()} | {"conftest"}
    bad = {
        str(p.relative_to(TESTS)): sorted(hit)
        for p in _test_modules()
        if (hit := _top_level_imports(p) & forbidden)
    }
    assert bad == {}, f"test modules importing test modules (share through helpers/): {bad}"
