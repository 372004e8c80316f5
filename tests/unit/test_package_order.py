"""Data flows one way (docs/architecture.md, "Package order"): the packages of
`zephon/` and of `torchtitan/` stand in the order that page declares, each imports
only those before it, and no files anywhere in zephon/, torchtitan/ or harness/
import each other in a circle. Every import counts: at module level, inside a
function, or for type checking only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from helpers import REPO

ARCHITECTURE = REPO / "docs" / "architecture.md"
ROOTS = ("zephon", "torchtitan", "harness")


def declared_order(text: str) -> dict[str, list[list[str]]]:
    """{"zephon": [[level 0 names], [level 1 names], ...]} from the page's lines
    `zephon: a, b -> c -> d` in its "Package order" section."""
    section = text.split("## Package order", 1)[1].split("\n## ", 1)[0]
    order = {}
    for top, levels in re.findall(r"^(\w+): (.+)$", section, re.M):
        order[top] = [[n.strip() for n in level.split(",")] for level in levels.split(" -> ")]
    return order


def unit_of(path: Path, top: Path) -> str:
    """The package (first folder) or top-level module a file of `top` belongs to."""
    return path.relative_to(top).parts[0].removesuffix(".py")


def imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, imported module, the line's text) of every import in `path`; `from a
    import b` names module `a.b` when that is a module, else `a`."""
    found = []
    lines = path.read_text().splitlines()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                target = sub if module_file(sub) else node.module
                found.append((node.lineno, target, lines[node.lineno - 1].strip()))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.append((node.lineno, alias.name, lines[node.lineno - 1].strip()))
    return found


def module_file(name: str, root: Path = REPO) -> Path | None:
    """The file of module `name` under `root`, or None (not this project's)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def order_violations(root: Path, top: str, levels: list[list[str]]) -> list[str]:
    level = {name: i for i, names in enumerate(levels) for name in names}
    pkg = root / top
    units = {unit_of(f, pkg) for f in pkg.rglob("*.py")}
    out = [f"{top}/{u}: not placed in the declared order" for u in sorted(units - set(level))]
    for f in sorted(pkg.rglob("*.py")):
        mine = unit_of(f, pkg)
        said = set()
        for line, module, text in imports(f):
            parts = module.split(".")
            if parts[0] != top or len(parts) < 2:
                continue
            other = parts[1]
            against = mine in level and other in level and level[other] >= level[mine]
            if other != mine and against and (line, other) not in said:
                said.add((line, other))
                out.append(
                    f"{f.relative_to(root)}:{line}: `{text}`: {mine} may import only what stands "
                    f"before it in the order, and {other} does not"
                )
    return out


def file_circles(root: Path, tops: tuple[str, ...]) -> list[list[str]]:
    """Every circle of files importing each other (strongly connected sets of two
    or more files, or a file importing itself)."""
    files = [f for top in tops for f in sorted((root / top).rglob("*.py"))]
    edges: dict[Path, set[Path]] = {f: set() for f in files}
    for f in files:
        for _, module, _ in imports(f):
            target = module_file(module, root)
            if target is not None and target in edges:
                edges[f].add(target)
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    circles = []

    def visit(v: Path) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges[v]:
                circles.append(sorted(str(g.relative_to(root)) for g in group))

    for f in files:
        if f not in index:
            visit(f)
    return circles


ORDER = declared_order(ARCHITECTURE.read_text())


@pytest.mark.parametrize("top", ["zephon", "torchtitan"])
def test_each_package_imports_only_those_before_it(top):
    problems = order_violations(REPO, top, ORDER[top])
    assert not problems, "\n".join(problems)


def test_no_files_import_each_other_in_a_circle():
    circles = file_circles(REPO, ROOTS)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_rules_see_a_backward_import_and_a_circle(tmp_path):
    pkg = tmp_path / "zephon"
    for name, body in {
        "errors.py": "",
        "sources/__init__.py": "",
        "sources/reader.py": "from zephon.errors import X\n",
        "recipe/__init__.py": "",
        "recipe/spec.py": "from zephon.sources.reader import R\n",
        "sources/formats.py": "def f():\n    from zephon.recipe.spec import S\n",
        "loader.py": "import zephon.loader\n",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(body)
    levels = [["errors"], ["sources"], ["recipe"], ["loader"]]
    (problem,) = order_violations(tmp_path, "zephon", levels)
    assert problem.startswith("zephon/sources/formats.py:2: `from zephon.recipe.spec import S`")
    assert file_circles(tmp_path, ("zephon",)) == [["zephon/loader.py"]]  # itself
    (pkg / "sources" / "reader.py").write_text("from zephon.recipe.spec import S\n")
    circles = file_circles(tmp_path, ("zephon",))
    assert ["zephon/recipe/spec.py", "zephon/sources/reader.py"] in circles
    unplaced = order_violations(tmp_path, "zephon", levels[:-1])
    assert "zephon/loader: not placed in the declared order" in unplaced
