"""Build the small real-text sample corpus from the local Python installation.

The corpus is made at setup time from text that every Python installation
ships with, so nothing is downloaded and nothing large is committed:

* prose: the documentation topics in ``pydoc_data.topics`` plus module, class
  and function docstrings of the standard library longer than 200 characters;
* code: the source of top-level functions and classes of the standard library
  (200 to 8000 characters each); a class longer than that contributes its
  methods instead, dedented.

Standard-library files are read and parsed with ``ast``, never imported.  The
build is deterministic (sorted file order, no randomness, fixed gzip headers),
so the same Python installation always gives the same bytes.

Beside the text, a small generated image-caption corpus (``sample_images.py``:
seeded scenes of coloured shapes with captions that describe them), whose
bytes are fixed for a given Python and Pillow build.

Layout under ``--out`` (default ``data/sample``)::

    prose/part-0000{0..3}.jsonl          training prose, plain JSONL
    code/part-0000{0..3}.jsonl.gz        training code, gzip JSONL
    code_parquet/part-0000{0..3}.parquet the same code documents, Parquet
    prose_hf/                            the training prose, Dataset.save_to_disk
    val/prose.jsonl, val/code.jsonl      held-out documents (never in training)
    images/part-0000{0..3}.tar           captioned images, WebDataset shards
    images_interleaved/part-00000.parquet  interleaved text-and-image documents
    val/images.tar                       held-out captioned images
    MANIFEST.json                        written last; marks a complete build

Each document is ``{"id": "<kind>-NNNNNN", "text": "..."}``.  A document is
held out for validation when a hash of its id says so (1 in 10 for prose, 1 in
25 for code), which gives a few hundred validation documents of each kind.

Usage::

    python scripts/tools/build_sample_data.py [--out data/sample] [--force]
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import sys
import sysconfig
import textwrap
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.sample_images import build_images
from zephon import atomic_write

FORMAT_VERSION = 2  # 2: the image corpus
NUM_SHARDS = 4
PARQUET_ROW_GROUP_SIZE = 256
MIN_DOCSTRING_CHARS = 200
MIN_CODE_CHARS = 200
MAX_CODE_CHARS = 8000
# Hold out one document in VAL_EVERY[kind], chosen by a hash of its id.
VAL_EVERY = {"prose": 10, "code": 25}
SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
)
OUTPUT_ENTRIES = frozenset(
    {
        "prose",
        "code",
        "code_parquet",
        "prose_hf",
        "val",
        "images",
        "images_interleaved",
        "MANIFEST.json",
    }
)
MANIFEST_NAME = "MANIFEST.json"

_DEF_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_DOC_NODES = (ast.Module, *_DEF_NODES)
# One source line with its ending, split the way the parser counts lines.
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


@dataclass(frozen=True)
class Doc:
    id: str
    text: str


def python_version() -> str:
    """The version string a corpus records; a different interpreter means a rebuild."""
    return f"{platform.python_implementation()} {platform.python_version()}"


# --------------------------------------------------------------------------- sources


def stdlib_files(stdlib: Path) -> list[Path]:
    """All ``.py`` files of the standard library outside the skipped folders, sorted."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        found.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(stdlib).as_posix())


def _parse(path: Path) -> tuple[str, ast.Module] | None:
    try:
        source = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. SyntaxWarning for invalid escapes
        try:
            tree = ast.parse(source, filename=str(path))
        except (SyntaxError, ValueError):
            return None
    return source, tree


class _Lines:
    """Source text indexed by line, for cheap repeated segment extraction.

    ``ast.get_source_segment`` re-splits the whole file on every call, which is
    quadratic for large modules; this does the same slicing (same line-ending
    rules, UTF-8 byte column offsets) after splitting once.
    """

    def __init__(self, source: str) -> None:
        self.lines: list[str] = _LINE_RE.findall(source)

    def segment(self, node: ast.stmt) -> str:
        """Like ``ast.get_source_segment(source, node)``."""
        first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[operator]
        head = self.lines[first].encode()
        end_col = node.end_col_offset
        if first == last:
            return head[node.col_offset : end_col].decode()
        parts = [head[node.col_offset :].decode(), *self.lines[first + 1 : last]]
        parts.append(self.lines[last].encode()[:end_col].decode())
        return "".join(parts)

    def full_lines(self, node: ast.stmt) -> str:
        """The node's whole lines, decorators included, dedented."""
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        head = "".join(self.lines[start - 1 : node.lineno - 1])
        indent = self.lines[node.lineno - 1][: node.col_offset]  # ASCII whitespace
        text = head + indent + self.segment(node)
        return textwrap.dedent(text) if indent else text


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from escapes in string literals
        return False
    return True


def collect(stdlib: Path) -> tuple[list[str], list[str], dict[str, int]]:
    """Return (prose texts, code texts, source statistics), deduplicated, in a fixed order."""
    from pydoc_data.topics import topics  # documentation prose shipped with Python

    prose: dict[str, None] = {}
    code: dict[str, None] = {}
    for key in sorted(topics):
        text = topics[key].strip()
        if text and _encodable(text):
            prose.setdefault(text, None)
    stats = {"topics": len(prose), "files_read": 0, "files_skipped": 0}

    def add_code(text: str) -> None:
        if MIN_CODE_CHARS <= len(text) <= MAX_CODE_CHARS:
            code.setdefault(text, None)

    for path in stdlib_files(stdlib):
        parsed = _parse(path)
        if parsed is None:
            stats["files_skipped"] += 1
            continue
        stats["files_read"] += 1
        source, tree = parsed
        for node in ast.walk(tree):
            if isinstance(node, _DOC_NODES):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) > MIN_DOCSTRING_CHARS and _encodable(doc):
                    prose.setdefault(doc, None)
        lines = _Lines(source)
        for node in tree.body:
            if not isinstance(node, _DEF_NODES):
                continue
            text = lines.full_lines(node)
            if len(text) > MAX_CODE_CHARS and isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, _DEF_NODES):
                        add_code(lines.full_lines(member))
            else:
                add_code(text)
    return list(prose), list(code), stats


# --------------------------------------------------------------------------- splitting


def is_validation(doc_id: str, kind: str) -> bool:
    """Deterministic hold-out rule: a hash of the id picks one in VAL_EVERY[kind]."""
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % VAL_EVERY[kind] == 0


def split_docs(kind: str, texts: Iterable[str]) -> tuple[list[list[Doc]], list[Doc]]:
    """Number the texts, hold out validation documents, deal the rest into shards."""
    shards: list[list[Doc]] = [[] for _ in range(NUM_SHARDS)]
    val: list[Doc] = []
    n_train = 0
    for i, text in enumerate(texts):
        doc = Doc(f"{kind}-{i:06d}", text)
        if is_validation(doc.id, kind):
            val.append(doc)
        else:
            shards[n_train % NUM_SHARDS].append(doc)
            n_train += 1
    return shards, val


# --------------------------------------------------------------------------- writers


def _jsonl_lines(docs: Iterable[Doc]) -> Iterator[str]:
    for d in docs:
        yield json.dumps({"id": d.id, "text": d.text}, ensure_ascii=False) + "\n"


def write_jsonl(path: Path, docs: list[Doc]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(_jsonl_lines(docs))


def write_jsonl_gz(path: Path, docs: list[Doc]) -> None:
    # Fixed header (no file name, mtime 0) so the bytes do not depend on when/where.
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as gz:
            with io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as f:
                f.writelines(_jsonl_lines(docs))


def write_parquet(path: Path, docs: list[Doc]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": pa.array([d.id for d in docs], type=pa.string()),
            "text": pa.array([d.text for d in docs], type=pa.string()),
        }
    )
    pq.write_table(table, path, row_group_size=PARQUET_ROW_GROUP_SIZE)


def write_hf(path: Path, docs: list[Doc]) -> None:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict(
        {"id": [d.id for d in docs], "text": [d.text for d in docs]},
        features=datasets.Features(
            {"id": datasets.Value("string"), "text": datasets.Value("string")}
        ),
    )
    ds.save_to_disk(str(path))


def _pillow_version() -> str:
    """The image files' bytes depend on the Pillow build that encoded them."""
    import PIL

    return PIL.__version__


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- build


def manifest_is_current(out: Path) -> bool:
    """True when OUT holds a complete build of this format from this Python."""
    try:
        manifest = json.loads((out / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict):
        return False
    if manifest.get("format_version") != FORMAT_VERSION:
        return False
    if manifest.get("python_version") != python_version():
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for rel, entry in files.items():
        try:
            if (out / rel).stat().st_size != entry["bytes"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def _check_replaceable(out: Path) -> None:
    """Refuse to delete a folder that does not look like one of our builds."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SystemExit(f"error: {out} exists and is not a folder")
    foreign = sorted(p.name for p in out.iterdir() if p.name not in OUTPUT_ENTRIES)
    if foreign:
        raise SystemExit(
            f"error: {out} holds files this script did not write ({', '.join(foreign[:5])}); "
            "remove them or choose another --out"
        )


def build(out: Path) -> dict:
    """Build the corpus into a staging folder, then move it into place at ``out``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prose_texts, code_texts, stats = collect(stdlib)
    prose_shards, prose_val = split_docs("prose", prose_texts)
    code_shards, code_val = split_docs("code", code_texts)

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.building"
    if stage.exists():
        shutil.rmtree(stage)  # left by an interrupted build
    for sub in ("prose", "code", "code_parquet", "val"):
        (stage / sub).mkdir(parents=True)

    doc_counts: dict[str, int] = {}
    for i, docs in enumerate(prose_shards):
        rel = f"prose/part-{i:05d}.jsonl"
        write_jsonl(stage / rel, docs)
        doc_counts[rel] = len(docs)
    for i, docs in enumerate(code_shards):
        rel = f"code/part-{i:05d}.jsonl.gz"
        write_jsonl_gz(stage / rel, docs)
        doc_counts[rel] = len(docs)
        rel = f"code_parquet/part-{i:05d}.parquet"
        write_parquet(stage / rel, docs)
        doc_counts[rel] = len(docs)
    for kind, docs in (("prose", prose_val), ("code", code_val)):
        rel = f"val/{kind}.jsonl"
        write_jsonl(stage / rel, docs)
        doc_counts[rel] = len(docs)
    prose_train = [d for shard in prose_shards for d in shard]
    write_hf(stage / "prose_hf", prose_train)
    hf_data = sorted((stage / "prose_hf").glob("*.arrow"))
    for path in hf_data:  # a single shard at this size
        doc_counts[path.relative_to(stage).as_posix()] = len(prose_train)
    image_counts = build_images(stage)
    doc_counts.update(image_counts)

    files: dict[str, dict] = {}
    for path in sorted(p for p in stage.rglob("*") if p.is_file()):
        rel = path.relative_to(stage).as_posix()
        entry: dict = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        if rel in doc_counts:
            entry = {"documents": doc_counts[rel], **entry}
        files[rel] = entry

    def text_bytes(docs: Iterable[Doc]) -> int:
        return sum(len(d.text.encode("utf-8")) for d in docs)

    code_train = [d for shard in code_shards for d in shard]
    folders = {
        "prose": (prose_train, "prose/"),
        "code": (code_train, "code/"),
        "code_parquet": (code_train, "code_parquet/"),
        "prose_hf": (prose_train, "prose_hf/"),
        "val/prose": (prose_val, "val/prose"),
        "val/code": (code_val, "val/code"),
    }
    manifest = {
        "format_version": FORMAT_VERSION,
        "python_version": python_version(),
        "source": {
            "stdlib_files_read": stats["files_read"],
            "stdlib_files_skipped": stats["files_skipped"],
            "pydoc_topics": stats["topics"],
        },
        "validation": {"rule": "sha256(id)[:8] as big-endian int % every == 0", "every": VAL_EVERY},
        "images": {"pillow": _pillow_version(), "documents": image_counts},
        "folders": {
            name: {
                "documents": len(docs),
                "text_bytes": text_bytes(docs),
                "file_bytes": sum(e["bytes"] for r, e in files.items() if r.startswith(prefix)),
            }
            for name, (docs, prefix) in folders.items()
        },
        "files": files,
    }
    # The manifest is the last thing written, whole or not at all.
    atomic_write(str(stage / MANIFEST_NAME), json.dumps(manifest, indent=2) + "\n")

    # Swap into place: drop the old manifest first so a half-removed old build
    # is never taken for a complete one.
    if out.exists():
        (out / MANIFEST_NAME).unlink(missing_ok=True)
        old = out.parent / f".{out.name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(out, old)
        os.replace(stage, out)
        shutil.rmtree(old)
    else:
        os.replace(stage, out)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/sample"), help="output folder")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    out: Path = args.out

    if not args.force and manifest_is_current(out):
        print(f"{out}: up to date (format {FORMAT_VERSION}, {python_version()})")
        return 0
    _check_replaceable(out)
    start = time.perf_counter()
    manifest = build(out)
    seconds = time.perf_counter() - start
    print(f"built {out} from {python_version()} stdlib in {seconds:.1f}s")
    for name, info in manifest["folders"].items():
        print(
            f"  {name:<13} {info['documents']:>6} docs  {info['text_bytes'] / 1e6:6.2f} MB text"
            f"  {info['file_bytes'] / 1e6:6.2f} MB on disk"
        )
    for rel, docs in manifest["images"]["documents"].items():
        size = manifest["files"][rel]["bytes"]
        print(f"  {rel:<37} {docs:>4} docs  {size / 1e6:6.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
