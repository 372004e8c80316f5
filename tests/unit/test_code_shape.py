"""The shape a newcomer relies on: zephon's folder listing is its architecture, no
class grows past a few screens, and nothing reaches code by editing the import path."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = ["zephon", "torchtitan", "scripts", "benchmarks", "tests", "harness"]
MAX_CLASS_LINES = 300
# zephon's top level holds its public entry points only; the stages are packages.
MAX_TOP_LEVEL_MODULES = 10


def python_files() -> list[Path]:
    return sorted(f for root in CODE if (REPO / root).is_dir() for f in (REPO / root).rglob("*.py"))


def long_classes(files: list[Path], root: Path = REPO) -> dict[str, int]:
    out = {}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    out[f"{f.relative_to(root)}::{node.name}"] = lines
    return out


def sys_path_edits(files: list[Path], root: Path = REPO) -> list[str]:
    """Calls on the interpreter's import path list (insert, append, extend) and
    assignments to it: `sys` `.path` in the parsed code."""
    out = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                target = next((t for t in targets if isinstance(t, ast.Attribute)), None)
            if (
                isinstance(target, ast.Attribute)
                and target.attr == "path"
                and isinstance(target.value, ast.Name)
                and target.value.id == "sys"
            ):
                out.append(f"{f.relative_to(root)}:{node.lineno}")
    return sorted(out)


def test_no_class_is_longer_than_300_lines():
    assert not long_classes(python_files())


def test_nothing_edits_sys_path():
    assert not sys_path_edits(python_files())


def test_zephons_top_level_is_its_entry_points_and_stage_packages():
    modules = sorted(p.name for p in (REPO / "zephon").glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules
    for stage in ["recipe", "sources", "lanes", "demand", "tokenize", "state", "images", "tools"]:
        assert (REPO / "zephon" / stage / "__init__.py").is_file(), stage
        doc = ast.get_docstring(ast.parse((REPO / "zephon" / stage / "__init__.py").read_text()))
        assert doc, f"zephon/{stage}/__init__.py says what the stage holds"


def test_the_rules_see_what_they_forbid(tmp_path):
    f = tmp_path / "bad.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    # The planted edits are built here so that no text search flags this file.
    edit = "sys" + ".path"
    f.write_text(f"import sys\n{edit}.insert(0, 'x')\n{edit} += ['y']\nclass Big:\n{body}\n")
    assert sys_path_edits([f], tmp_path) == ["bad.py:2", "bad.py:3"]
    assert long_classes([f], tmp_path) == {"bad.py::Big": MAX_CLASS_LINES + 1}
