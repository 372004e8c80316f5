"""Checks of the bundled tokenizer and the sample corpus built from the stdlib.

The corpus under ``data/sample`` is used when it is a complete build; if it is
missing, it is built once into a temporary folder (about 10-20 s).
"""

from __future__ import annotations

import gzip
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from helpers import REPO
from tokenizers import Tokenizer

TOKENIZER = REPO / "assets" / "tokenizer" / "tokenizer.json"
SAMPLE = REPO / "data" / "sample"


def _load_builder() -> ModuleType:
    import build_sample_data  # scripts/tools/, on the tests' pythonpath

    return build_sample_data


@pytest.fixture(scope="module")
def builder() -> ModuleType:
    return _load_builder()


@pytest.fixture(scope="module")
def corpus(builder: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if builder.manifest_is_current(SAMPLE):
        return SAMPLE
    out = tmp_path_factory.mktemp("corpus") / "sample"
    assert builder.main(["--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def manifest(corpus: Path) -> dict:
    return json.loads((corpus / "MANIFEST.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER))


def _read_jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def _count_docs(path: Path) -> int:
    name = path.name
    if name.endswith((".jsonl", ".jsonl.gz")):
        return sum(1 for _ in _read_jsonl(path))
    if name.endswith(".parquet"):
        return pq.ParquetFile(path).metadata.num_rows
    if name.endswith(".arrow"):
        with ipc.open_stream(path) as reader:
            return reader.read_all().num_rows
    if name.endswith(".tar"):  # WebDataset: one sample per key
        with tarfile.open(path) as tar:
            return len({m.name.split(".", 1)[0] for m in tar.getmembers()})
    raise AssertionError(f"no document counter for {path}")


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_file_and_special_tokens(tokenizer: Tokenizer) -> None:
    assert TOKENIZER.stat().st_size < 1_000_000
    assert tokenizer.token_to_id("<|endoftext|>") == 0
    assert tokenizer.token_to_id("<|pad|>") == 1
    assert tokenizer.get_vocab_size() == 8192
    # No post-processor: nothing is added around the text.
    assert tokenizer.encode("").ids == []
    assert len(tokenizer.encode("a").ids) == 1
    assert tokenizer.encode("<|endoftext|>").ids == [0]


@pytest.mark.parametrize(
    "text",
    [
        'def greet(name: str) -> str:\n    """Say hello."""\n    return f"hello {name}"\n',
        "class Foo(Bar):\n\tdef __init__(self):\r\n\t\tpass  # trailing  \n\n",
        " leading space, double  spaces and a trailing one ",
        "Return the number of items in a container.  See also :func:`len`.",
        "Café, naïve, façade — “smart quotes”, 日本語のテキスト, Ελληνικά, emoji 🐍✨",
        "x = '\\u00e9' + '\x00\x7f' + '\u00a0\u2028'",
    ],
)
def test_tokenizer_round_trip(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


# --------------------------------------------------------------------------- corpus


def test_manifest_counts_match_files(corpus: Path, manifest: dict, builder: ModuleType) -> None:
    assert manifest["format_version"] == builder.FORMAT_VERSION
    listed = set(manifest["files"])
    on_disk = {
        p.relative_to(corpus).as_posix()
        for p in corpus.rglob("*")
        if p.is_file() and p.name != "MANIFEST.json"
    }
    assert listed == on_disk
    for rel, entry in manifest["files"].items():
        assert (corpus / rel).stat().st_size == entry["bytes"], rel
        if "documents" in entry:
            assert _count_docs(corpus / rel) == entry["documents"], rel
    for name in ("prose", "code", "code_parquet"):
        total = sum(
            e["documents"] for r, e in manifest["files"].items() if r.startswith(name + "/")
        )
        assert total == manifest["folders"][name]["documents"] > 0
    assert len(list((corpus / "prose").glob("part-*.jsonl"))) == 4
    assert len(list((corpus / "code").glob("part-*.jsonl.gz"))) == 4


def test_ids_unique_and_validation_held_out(corpus: Path, builder: ModuleType) -> None:
    train_files = sorted((corpus / "prose").glob("*.jsonl")) + sorted(
        (corpus / "code").glob("*.jsonl.gz")
    )
    val_files = [corpus / "val" / "prose.jsonl", corpus / "val" / "code.jsonl"]
    train_ids: list[str] = []
    val_ids: list[str] = []
    for files, ids in ((train_files, train_ids), (val_files, val_ids)):
        for path in files:
            for doc in _read_jsonl(path):
                assert isinstance(doc["text"], str) and doc["text"], doc["id"]
                ids.append(doc["id"])
    all_ids = train_ids + val_ids
    assert len(all_ids) == len(set(all_ids)), "duplicate document ids"
    assert not set(train_ids) & set(val_ids)
    assert 100 <= sum(i.startswith("prose-") for i in val_ids) <= 1000
    assert 100 <= sum(i.startswith("code-") for i in val_ids) <= 1000
    for doc_id in val_ids:
        assert builder.is_validation(doc_id, doc_id.split("-")[0])
    for doc_id in train_ids[::97]:
        assert not builder.is_validation(doc_id, doc_id.split("-")[0])


def test_mirrored_formats_hold_the_same_documents(corpus: Path) -> None:
    for gz_path in sorted((corpus / "code").glob("*.jsonl.gz")):
        pq_path = corpus / "code_parquet" / gz_path.name.replace(".jsonl.gz", ".parquet")
        pf = pq.ParquetFile(pq_path)
        assert pf.schema_arrow.names == ["id", "text"]
        assert all(pf.metadata.row_group(i).num_rows <= 256 for i in range(pf.num_row_groups))
        table = pf.read()
        docs = list(_read_jsonl(gz_path))
        assert table.column("id").to_pylist() == [d["id"] for d in docs]
        assert table.column("text").to_pylist() == [d["text"] for d in docs]

    datasets = pytest.importorskip("datasets")
    hf = datasets.load_from_disk(str(corpus / "prose_hf"))
    assert hf.column_names == ["id", "text"]
    prose_ids = [
        d["id"] for path in sorted((corpus / "prose").glob("*.jsonl")) for d in _read_jsonl(path)
    ]
    assert sorted(hf["id"]) == sorted(prose_ids)


# --------------------------------------------------------------------------- images


def test_image_corpus_reads_decodes_and_holds_out(
    corpus: Path, manifest: dict, tmp_path: Path
) -> None:
    from zephon.images import prepare_image
    from zephon.schema.recipe import ImageSpec, SourceSpec
    from zephon.sources import SourceReader

    spec = ImageSpec()
    keys: dict[str, set[str]] = {}
    for split, pattern in (("train", "images/part-*.tar"), ("val", "val/images.tar")):
        paths = tuple(str(p) for p in sorted(corpus.glob(pattern)))
        source = SourceSpec(name=split, paths=paths, format="webdataset")
        reader = SourceReader(source, str(tmp_path))
        docs = reader.read_range(0, reader.num_docs)
        keys[split] = {d.name.rsplit("key ", 1)[1] for d in docs}
        sizes = set()
        for doc in docs:
            (image,) = doc.images
            out = prepare_image(image.data, image.name, spec)
            assert out.num_tokens >= 4 and out.patches.dtype.name == "uint8"
            sizes.add(out.grid)
            assert doc.text.endswith("background.")
        assert len(sizes) >= 4  # varied sizes and aspect ratios
    counts = manifest["images"]["documents"]
    assert len(keys["train"]) == sum(n for r, n in counts.items() if r.startswith("images/"))
    assert not keys["train"] & keys["val"] and len(keys["val"]) >= 40
    # captions count what the json metadata says was drawn
    with tarfile.open(corpus / "images" / "part-00000.tar") as tar:
        for member in tar.getmembers():
            if member.name.endswith(".json"):
                record = json.loads(tar.extractfile(member).read())  # type: ignore[union-attr]
                words = record["caption"].lower().replace(",", " ").split()
                for colour in {o["colour"] for o in record["objects"]}:
                    assert colour in words, record
    interleaved = SourceSpec(
        name="books",
        paths=(str(corpus / "images_interleaved" / "part-00000.parquet"),),
        format="parquet",
        texts_field="texts",
        images_field="images",
    )
    books = SourceReader(interleaved, str(tmp_path))
    doc = books.read_range(0, 1)[0]
    assert len(doc.images) >= 2 and doc.text.startswith("Picture book page 0.")
