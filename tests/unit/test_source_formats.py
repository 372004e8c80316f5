"""The source format registry (zephon/sources/formats.py): a format added in one module
with one registration is read by the loader like a built-in one.

The format here is the worked example of docs/adding_a_source_format.md: a UTF-8
text file, one document per non-blank line. It is registered by a fixture and
unregistered after, so the registry the other tests see holds the built-ins only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.corpus import synthetic_docs
from helpers.loader import close, make_ranks, save, step_digests

from zephon import DataError, RecipeError, StateError, load_recipe, load_tokenizer
from zephon.sources import (
    SourceFormat,
    SourcePart,
    SourceReader,
    format_names,
    register_format,
    unregister_format,
)
from zephon.sources.formats import get_format
from zephon.sources.storage import ByteObject
from zephon.tokenize.tokenizer import encode_texts

BUILTIN = ("jsonl", "parquet", "hf_disk", "hf", "tokens", "webdataset")


# -- the walkthrough's format: one module's worth --------------------------------------


class TextLines(SourcePart):
    """One document per non-blank line of a UTF-8 text file, in file order."""

    def __init__(self, obj: ByteObject):
        self.obj = obj
        data = obj.pread(0, obj.size)
        if len(data) != obj.size:
            raise DataError(f"{obj.url}: read {len(data)} of {obj.size} bytes")
        # (start, end, line number) of every non-blank line: a function of the bytes alone.
        self.lines: list[tuple[int, int, int]] = []
        pos = 0
        for number, line in enumerate(data.split(b"\n"), start=1):
            if line.strip():
                self.lines.append((pos, pos + len(line), number))
            pos += len(line) + 1

    def __len__(self) -> int:
        return len(self.lines)

    def read(self, a: int, b: int) -> list[Any]:
        lo, hi = self.lines[a][0], self.lines[b - 1][1]
        blob = self.obj.pread(lo, hi - lo)
        out = []
        for start, end, number in self.lines[a:b]:
            try:
                out.append(blob[start - lo : end - lo].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{self.obj.url}:{number}: not valid UTF-8 ({exc.reason})"
                ) from None
        return out

    def content_files(self) -> list[ByteObject]:
        return [self.obj]


def open_lines(spec: Any, files: list[ByteObject], cache_dir: str) -> list[TextLines]:
    if spec.token_field:
        raise DataError(f"source '{spec.name}': format 'lines' holds text, not token ids")
    return [TextLines(obj) for obj in files]


LINES = SourceFormat("lines", open_lines, suffixes=(".lines",))


@pytest.fixture
def lines_format() -> Iterator[SourceFormat]:
    register_format(LINES)  # in a module of its own: this line at its end
    yield LINES
    unregister_format("lines")


# -- helpers -------------------------------------------------------------------------------


def write_recipe(root: Path, source: str, lanes: int = 8) -> Path:
    path = root / "recipe.toml"
    path.write_text(
        f'[recipe]\nname = "lines"\nseed = 7\nlanes = {lanes}\n'
        "[shuffle]\nblock_size = 16\n"
        f'[execution]\nworkers = 0\nprefetch = 0\ncache_dir = "{root / "cache"}"\n'
        f'[[source]]\nname = "poems"\n{source}'
    )
    return path


def documents(batches: list[Any]) -> list[list[int]]:
    """The token ids of the documents that start inside a row (positions restart at 0
    at each), each up to the next start or the row's end. (Positions restart at a
    row's start too, where a document may continue: that piece is left out.)"""
    out = []
    for batch in batches:
        ids, pos = batch.input_ids.numpy(), batch.positions.numpy()
        for row, positions in zip(ids, pos, strict=True):
            starts = np.flatnonzero(positions == 0).tolist() + [len(row)]
            out += [row[a:b].tolist() for a, b in zip(starts[1:], starts[2:], strict=False)]
    return out


# -- tests ---------------------------------------------------------------------------------


def test_the_registry_lists_exactly_the_built_in_formats() -> None:
    assert format_names() == BUILTIN
    assert get_format("hf_disk").folders and not get_format("hf").remote


def test_a_registered_format_is_loaded_alike_at_two_data_parallel_sizes(
    lines_format: SourceFormat, tmp_path: Path, tokenizer_path: str
) -> None:
    docs = [f"poem {i}: {text}" for i, text in enumerate(synthetic_docs(150, seed=3))]
    text = "\n".join(docs[:70]) + "\n\n   \n" + "\n".join(docs[70:]) + "\n"  # blank lines
    (tmp_path / "poems.lines").write_text(text, encoding="utf-8")
    recipe = write_recipe(tmp_path, 'path = "poems.lines"\nformat = "lines"\n')
    (spec,) = load_recipe(recipe).sources
    assert spec.format == "lines"
    assert SourceReader(spec, str(tmp_path / "cache")).read_range(0, 150) == docs

    batches: list[Any] = []
    ranks = make_ranks(recipe, tokenizer_path, 1)
    reference = step_digests(ranks, 4, batches)
    close(ranks)
    ranks = make_ranks(recipe, tokenizer_path, 4)
    assert step_digests(ranks, 4) == reference
    close(ranks)

    # The text arrives: every document start in the batches is the start of a line's ids.
    tok = load_tokenizer(tokenizer_path)
    full = [ids.tolist() for ids in encode_texts(docs, tok)]
    seen = documents([b for step in batches for b in step])
    found = {next((k for k, f in enumerate(full) if f[: len(s)] == s), None) for s in seen}
    assert None not in found and len(found) > 20

    # format = "auto" takes the registered suffix.
    auto = write_recipe(tmp_path, 'path = "poems.lines"\n')
    assert load_recipe(auto).sources[0].format == "lines"


def test_a_resume_on_a_changed_file_of_a_registered_format_is_refused(
    lines_format: SourceFormat, tmp_path: Path, tokenizer_path: str
) -> None:
    """content_files reach the checkpoint: a file changed under a run is caught."""
    file = tmp_path / "poems.lines"
    file.write_text("\n".join(synthetic_docs(60, seed=5)) + "\n", encoding="utf-8")
    recipe = write_recipe(tmp_path, 'path = "poems.lines"\nformat = "lines"\n')
    ranks = make_ranks(recipe, tokenizer_path, 2)
    step_digests(ranks, 2)
    state = json.loads(json.dumps(save(ranks)))
    close(ranks)
    file.write_text(file.read_text().replace("doc1 ", "doc1!"), encoding="utf-8")
    resumed = make_ranks(recipe, tokenizer_path, 2)
    with pytest.raises(StateError, match="poems.lines"):
        resumed[0].load_state_dict(state)
    close(resumed)


def test_a_bad_record_names_its_file_and_line(lines_format: SourceFormat, tmp_path: Path) -> None:
    (tmp_path / "bad.lines").write_bytes(b"fine\n\xff broken\nfine too\n")
    recipe = write_recipe(tmp_path, 'path = "bad.lines"\nformat = "lines"\n')
    reader = SourceReader(load_recipe(recipe).sources[0], str(tmp_path / "cache"))
    assert reader.read_range(0, 1) == ["fine"] and reader.read_range(2, 3) == ["fine too"]
    with pytest.raises(DataError, match=r"bad\.lines:2: not valid UTF-8"):
        reader.read_range(0, 3)


def test_an_unknown_format_lists_the_registered_ones(
    lines_format: SourceFormat, tmp_path: Path
) -> None:
    (tmp_path / "poems.lines").write_text("one\n")
    recipe = write_recipe(tmp_path, 'path = "poems.lines"\nformat = "line"\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    known = ", ".join((*BUILTIN, "lines"))
    assert str(err.value) == (
        f"{recipe}:14: source 'poems'.format: expected one of auto, {known}; got 'line'"
    )


def test_a_format_name_is_registered_once(lines_format: SourceFormat) -> None:
    with pytest.raises(ValueError, match="'lines' is registered already"):
        register_format(LINES)
    with pytest.raises(ValueError, match="other than 'auto'"):
        register_format(SourceFormat("auto", open_lines))
    with pytest.raises(KeyError, match="registered formats: jsonl, .*, lines"):
        get_format("csv")
