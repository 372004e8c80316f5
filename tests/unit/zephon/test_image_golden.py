"""Golden digests of an image-text recipe: the bytes of its batches, pixels and
grids included, never change; nor do they through phases (a seq_len change that
carries documents with images, a paused source, a lane-count change 4 -> 6).

The other image tests are relational (D = 1 equals D = 4, a resume equals the
original), so pixels or sizes that are wrong the same way in every run pass
them. `tests/golden/image_digests.json` holds, per step at one rank, the global
batch digest (which folds in each image's grid and the hash its worker made),
a digest of the step's pixels computed here from the batch's patches and grids
(so it does not rely on that hash), and the number of images. Written once by
the code of issue 27 over a corpus generated here from fixed seeds: WebDataset
caption pairs, interleaved Parquet documents and a text-only source. Images are
lossless PNG (RGB, RGBA over the background, grey), of sizes that are not whole
merge windows, several of them exactly half a window over in width or height,
so the rounding of both sides is pinned. Each test runs its case at 2 ranks
with 2 decode workers and resumes a mid-run state on 3 ranks.

The pixels are those of the Pillow the file records (the resampling is
Pillow's; PNG decoding is lossless, so no other library shapes them): on
another Pillow the tests are skipped, saying so.

Regenerate only for a deliberate, documented format change:
    PYTHONPATH=tests python tests/unit/zephon/test_image_golden.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import GOLDEN as GOLDEN_DIR
from helpers.corpus import COMMITTED_TOKENIZER, synthetic_docs, write_jsonl
from helpers.images import encode, write_tar
from helpers.loader import close, make_ranks, save, step_digests
from PIL import Image

from zephon.batch import Batch

GOLDEN = GOLDEN_DIR / "image_digests.json"
# patch 8, merge 2: windows of 16 pixels; 1 to 16 windows (18-token blocks at most)
IMAGE = "[image]\npatch_size = 8\nmerge = 2\nmin_pixels = 256\nmax_pixels = 4096\n"
# (width, height): 40 = 2.5 windows, 56 = 3.5, 72 = 4.5, 88 = 5.5 (halves, rounded
# up), 24 = 1.5, 36 = 2.25; all within the pixel bounds once rounded
SIZES = ((40, 32), (24, 40), (56, 24), (72, 36), (32, 32), (88, 24), (48, 16), (36, 56))
STEPS, STATE_STEP = 6, 3
PHASES = """
[[phase]]
name = "a"
start_step = 0
seq_len = 64
global_batch_size = 12
[[phase]]
name = "b"
start_step = 2
seq_len = 48
weights = { captions = 1, interleaved = 1 }
[[phase]]
name = "c"
start_step = 4
lanes = 6
weights = { captions = 1, interleaved = 1, prose = 1 }
"""
CASES = {
    "image_text_best_fit": ("best_fit", ""),
    "image_text_concat": ("concat", ""),
    "image_text_phases_best_fit": ("best_fit", PHASES),
    "image_text_phases_concat": ("concat", PHASES),
}


def _png(rng: np.random.Generator, k: int) -> bytes:
    """A noise image of one of SIZES: RGB, RGBA or grey by k."""
    width, height = SIZES[int(rng.integers(len(SIZES)))]
    channels = (3, 4, 1)[k % 3]
    shape = (height, width, channels) if channels > 1 else (height, width)
    return encode(Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)), "PNG")


def _words(rng: np.random.Generator, n: int) -> str:
    return " ".join(synthetic_docs(1, seed=int(rng.integers(1 << 30)), max_words=n))


def build_corpus(folder: Path) -> str:
    """The three sources under `folder`; returns their [[source]] tables."""
    rng = np.random.default_rng(2718)
    members = []
    for i in range(40):
        members += [(f"k{i:04d}.png", _png(rng, i)), (f"k{i:04d}.txt", _words(rng, 12).encode())]
    write_tar(folder / "captions.tar", members)
    texts, images = [], []
    for d in range(16):
        t: list[str | None] = [_words(rng, 20)]
        im: list[dict[str, Any] | None] = [None]
        for k in range(int(rng.integers(1, 4))):
            t += [None, _words(rng, 10)]
            im += [{"bytes": _png(rng, d + k), "path": None}, None]
        texts.append(t)
        images.append(im)
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "texts": pa.array(texts, type=pa.list_(pa.string())),
            "images": pa.array(images, type=pa.list_(struct)),
        }
    )
    pq.write_table(table, folder / "interleaved.parquet", row_group_size=6)
    write_jsonl(folder / "prose.jsonl", synthetic_docs(50, seed=2719))
    return (
        '[[source]]\nname = "captions"\npath = "captions.tar"\nweight = 0.4\n'
        '[[source]]\nname = "interleaved"\npath = "interleaved.parquet"\n'
        'texts_field = "texts"\nimages_field = "images"\nweight = 0.3\n'
        '[[source]]\nname = "prose"\npath = "prose.jsonl"\nweight = 0.3\n'
    )


def build_case(root: Path, name: str) -> Path:
    algorithm, phases = CASES[name]
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / "recipe.toml"
    recipe.write_text(
        f'[recipe]\nname = "{name}"\nseed = 99\nlanes = 4\n'
        "[shuffle]\nblock_size = 4\n"
        f'[packing]\nalgorithm = "{algorithm}"\nopen_bins = 3\nflush_interval = 3\n'
        f'{IMAGE}[execution]\ncache_dir = "{folder / "cache"}"\n'
        f"{build_corpus(folder)}{phases}"
    )
    return recipe


def pixels(step: list[Batch]) -> tuple[str, int]:
    """SHA-256 of a step's images in canonical order (each grid as int64 LE, then
    its patches), from the ranks' batches in rank order; and how many there are."""
    h, n = hashlib.sha256(), 0
    for batch in step:
        im = batch.images
        if im is None:
            continue
        offsets = im.patch_offsets().tolist()
        for k in range(im.num_images):
            h.update(im.grids[k].numpy().astype("<i8").tobytes())
            h.update(im.patches[offsets[k] : offsets[k + 1]].numpy().tobytes())
        n += im.num_images
    return h.hexdigest(), n


def run_case(
    recipe: Path, dp: int, steps: int, state: dict[str, Any] | None = None, **kw: Any
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """{"digests", "pixels", "images"} per step on `dp` ranks (from `state` if
    given, else from the start), and the state saved after STATE_STEP steps."""
    loaders = make_ranks(
        recipe, str(COMMITTED_TOKENIZER), dp, seq_len=64, global_batch_size=8, **kw
    )
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    batches: list[list[Batch]] = []
    digests = step_digests(loaders, min(steps, STATE_STEP), batches)
    saved = json.loads(json.dumps(save(loaders)))
    digests += step_digests(loaders, steps - len(digests), batches)
    close(loaders)
    seen = [pixels(step) for step in batches]
    return {
        "digests": digests,
        "pixels": [p for p, _ in seen],
        "images": [n for _, n in seen],
    }, saved


def golden() -> dict[str, Any]:
    data = json.loads(GOLDEN.read_text())
    import PIL

    if PIL.__version__ != data["pillow"]:
        pytest.skip(f"pixels pinned with Pillow {data['pillow']}, this is {PIL.__version__}")
    return data


@pytest.mark.parametrize("name", sorted(CASES))
def test_image_digests_and_pixels_pinned_at_two_ranks_and_resumed_at_three(tmp_path, name):
    """Case `name`: its digests, pixel digests and image counts at 2 ranks (2 decode
    workers), and from its state after step 3 on 3 ranks, are the committed ones."""
    expected = golden()["cases"][name]
    assert min(expected["images"]) > 0  # every step holds images
    recipe = build_case(tmp_path, name)
    got, state = run_case(recipe, 2, STEPS, num_workers=2, prefetch=1)
    assert got == expected
    resumed, _ = run_case(recipe, 3, STEPS - STATE_STEP, state)
    assert resumed == {k: v[STATE_STEP:] for k, v in expected.items()}


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    import PIL

    out: dict[str, Any] = {"pillow": PIL.__version__, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in sorted(CASES):
            out["cases"][case], _ = run_case(build_case(Path(tmp), case), 1, STEPS, num_workers=0)
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
