"""The seams of the trainer stay where the issue put them: the training loop and the
generic packages import no particular model, and the data glue names no loader kind."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from helpers import REPO

from torchtitan.datasets.dataloader import TrainDataLoader

PACKAGE = REPO / "torchtitan"
MODEL_AGNOSTIC = ["train.py", "distributed", "components", "datasets", "config", "runtime"]
ALLOWED_MODEL_IMPORTS = {
    "torchtitan.models",
    "torchtitan.models.spec",
    "torchtitan.models.hf_folder",
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_only_the_model_folders_import_a_model():
    files = []
    for entry in MODEL_AGNOSTIC:
        path = PACKAGE / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    bad = {
        str(f.relative_to(PACKAGE)): sorted(m)
        for f in files
        if (m := {i for i in _imports(f) if i.startswith("torchtitan.models")}
            - ALLOWED_MODEL_IMPORTS)
    }  # fmt: skip
    assert not bad, f"model-specific imports outside torchtitan/models: {bad}"


def test_the_data_glue_names_no_loader_kind():
    """Only `from_config` picks a loader kind; the collectives never ask which one runs."""
    source = inspect.getsource(TrainDataLoader)
    (cls,) = ast.parse(source).body
    assert isinstance(cls, ast.ClassDef)
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name != "from_config":
            code = ast.get_source_segment(source, node) or ""
            for word in ("zephon", "Zephon", '"hf"', "HFBaseline", "isinstance", ".kind"):
                assert word not in code, f"TrainDataLoader.{node.name} mentions {word!r}"


ZEPHON_PUBLIC = {"zephon", "zephon.images", "zephon.schema", "zephon.sources"}


def zephon_internal_imports(root: Path) -> dict[str, list[str]]:
    """Each file under `root` that imports a zephon module other than its public facades."""
    bad = {}
    for f in sorted(root.rglob("*.py")):
        internal = sorted(
            m for m in _imports(f) if m.split(".")[0] == "zephon" and m not in ZEPHON_PUBLIC
        )
        if internal:
            bad[str(f.relative_to(root.parent))] = internal
    return bad


def test_the_trainer_imports_only_zephons_public_face():
    """zephon's stage modules may move freely: the trainer sees `zephon`, `zephon.images`,
    `zephon.schema` and `zephon.sources` only (docs/architecture.md)."""
    assert not zephon_internal_imports(PACKAGE), zephon_internal_imports(PACKAGE)


# A component benchmark: it times the image stage's own parts (header scans, the patch
# arena, the decode processes' settings), which no public name reaches.
INTERNAL_BENCHMARKS = {"benchmarks/bench_image_work.py"}


def test_scripts_and_benchmarks_import_only_zephons_public_face():
    """What zephon/__init__.py says: the scripts and the benchmarks use the public face
    too, the one component benchmark named above excepted."""
    found = {
        **zephon_internal_imports(REPO / "scripts"),
        **zephon_internal_imports(REPO / "benchmarks"),
    }
    assert set(found) <= INTERNAL_BENCHMARKS, found


def test_the_rule_sees_an_internal_import(tmp_path):
    (tmp_path / "torchtitan").mkdir()
    (tmp_path / "torchtitan" / "glue.py").write_text(
        "from zephon import ZephonLoader\nfrom zephon.state.checkpoint_state import boundary_of\n"
    )
    assert zephon_internal_imports(tmp_path / "torchtitan") == {
        "torchtitan/glue.py": ["zephon.state.checkpoint_state"]
    }


def test_every_public_name_of_zephon_resolves_and_an_image_decode_process_imports_no_loader():
    """The public face is lazy (PEP 562): every exported name resolves to its module's
    object, and importing the image stage alone (what a decode process does) does
    not load the loader, its sources or the tokenizer."""
    import subprocess
    import sys

    import zephon

    assert sorted(zephon.__all__) == sorted(zephon._HOME)
    for name in zephon.__all__:
        assert getattr(zephon, name) is not None
    code = (
        "import sys, zephon.images.decode_processes; "
        "print(sorted(m for m in sys.modules if m in "
        "('zephon.loader', 'zephon.sources', 'tokenizers', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
