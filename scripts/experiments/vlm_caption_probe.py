#!/usr/bin/env python
"""Does the VLM use what it sees? Caption loss with each caption's own image
against the same captions with the images shuffled.

1. Writes a captioned-scene corpus with the sample generator
   (`harness/sample_images.py`, its `write_shard`): `--train-images` scenes
   from one seed for training, `--heldout` scenes from another seed that
   training never reads. Captions name what the pixels show: colours, shapes,
   counts, the relation of two groups, the background.
2. Trains the vlm debugmodel on the training shards through the trainer
   (torchrun -m torchtitan.train, `train_configs/vlm_caption_probe.toml`, 2 CPU
   processes), captions only.
3. Reads the final checkpoint into one process and runs the held-out shard
   through the Zephon loader (one lane, no shuffle, packed as in training).
   The caption loss is the mean cross-entropy over caption text tokens only:
   targets that are neither image tokens nor BOS/EOS/padding. It is measured
   twice on the same batches: with each caption's own image, and with the
   pixels permuted among the images by a fixed derangement. The derangement
   only exchanges images of the same patch grid (in canonical order, each grid's
   images shifted by one), so tokens, placeholder counts and positions are
   identical in both runs and only the pixels differ.

Target: the loss with the right image at least 10% below the shuffled one.
Writes the raw results (`--results`, default
docs/results/vlm_caption_probe.json), the page beside it (.md) and, for the
committed results, the summary between the `vlm_caption_probe` markers of
docs/images.md (QUOTED_IN); `--render JSON` regenerates those from a JSON. Exit status 1 when
the target is missed.

    .venv/bin/python scripts/experiments/vlm_caption_probe.py                  # about 10 minutes
    .venv/bin/python scripts/experiments/vlm_caption_probe.py --steps 20 --results /tmp/p.json
    .venv/bin/python scripts/experiments/vlm_caption_probe.py --render docs/results/vlm_caption_probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import sample_images
from harness.train import REPO, quote_in_page, read_metrics, render_results, run_logged

CONFIG = REPO / "train_configs" / "vlm_caption_probe.toml"
TOKENIZER = REPO / "assets" / "tokenizer" / "tokenizer.json"
RESULTS = REPO / "docs" / "results" / "vlm_caption_probe.json"
# The documentation page whose `<!-- NAME:begin/end -->` markers quote this script's summary.
QUOTED_IN = "docs/images.md"
# Seeds of the probe's corpus: neither is the sample corpus's, and they differ,
# so no held-out scene is drawn in training.
TRAIN_SEED, HELDOUT_SEED = 1_000_001, 2_000_002
PER_SHARD = 500
TARGET = 0.10  # the right image's loss at least 10% below the shuffled one
EVAL_ROWS = 16

# Scenes downscaled to at most 16 merge windows (64 x 64 pixels): the colours,
# shapes and layout stay visible, and a short CPU run sees many more pairings
# than at the sample recipe's 64 windows.
RECIPE = """\
# Written by scripts/experiments/vlm_caption_probe.py.
[recipe]
name = "vlm-caption-probe-{part}"
seed = 7
lanes = {lanes}

[mixture]
unit = "tokens"
on_exhausted = "{exhausted}"

[shuffle]
enabled = {shuffle}
block_size = 64

[packing]
algorithm = "best_fit"
flush_interval = 32

[execution]
workers = {workers}
prefetch = 2

[image]
patch_size = 8
merge = 2
min_pixels = 1024
max_pixels = 4096

[[source]]
name = "captions"
path = "{part}/*.tar"
format = "webdataset"
"""


def write_part(folder: Path, seed: int, count: int, prefix: str) -> int:
    """`count` captioned scenes from `seed` in shards of PER_SHARD; the recipe
    beside them is written by the caller."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for s, first in enumerate(range(0, count, PER_SHARD)):
        n = min(PER_SHARD, count - first)
        sample_images.write_shard(folder / f"part-{s:05d}.tar", rng, first, n, prefix)
    return count


def build_corpus(work: Path, train_images: int, heldout: int) -> tuple[Path, Path]:
    """(training recipe, held-out recipe) under `work`/corpus."""
    corpus = work / "corpus"
    if corpus.exists():
        shutil.rmtree(corpus)
    write_part(corpus / "train", TRAIN_SEED, train_images, "train-")
    write_part(corpus / "heldout", HELDOUT_SEED, heldout, "heldout-")
    train = corpus / "train.toml"
    train.write_text(
        RECIPE.format(part="train", lanes=8, exhausted="repeat", shuffle="true", workers=2)
    )
    held = corpus / "heldout.toml"
    held.write_text(
        RECIPE.format(part="heldout", lanes=1, exhausted="stop", shuffle="false", workers=0)
    )
    return train, held


def derangement(grids: list[tuple[int, int]]) -> list[int]:
    """perm[i]: the image whose pixels go with caption i. Within each grid, the
    images in canonical order each take the next one's pixels (the last the
    first's), so no caption keeps its own image and every placeholder count stays.
    ValueError if a grid has a single image (it has no partner to swap with)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, g in enumerate(grids):
        groups.setdefault(g, []).append(i)
    perm = list(range(len(grids)))
    for grid, members in groups.items():
        if len(members) < 2:
            raise ValueError(f"held-out grid {grid} has one image: no derangement keeps its tokens")
        for a, b in zip(members, members[1:] + members[:1], strict=True):
            perm[a] = b
    return perm


def heldout_batches(recipe: Path) -> tuple[list[Any], Any]:
    """Every batch of the held-out recipe (one pass, as packed for training) and
    the tokenizer info."""
    from zephon import ZephonLoader

    loader = ZephonLoader(recipe, TOKENIZER, 256, EVAL_ROWS, num_workers=0, prefetch=0)
    try:
        return list(loader), loader.tok
    finally:
        loader.close()


def caption_mask(labels: torch.Tensor, tok: Any) -> torch.Tensor:
    """Targets that are caption text: not ignored (image tokens, padding), not BOS/EOS/pad."""
    from zephon import IGNORE_INDEX

    mask = labels != IGNORE_INDEX
    for special in (tok.eos_id, tok.bos_id, tok.pad_id):
        if special is not None:
            mask &= labels != special
    return mask


def with_pixels(images: Any, patches: list[np.ndarray]) -> Any:
    """`images` with each image's patches replaced (same grids, rows, starts)."""
    return dataclasses.replace(images, parts=tuple(torch.from_numpy(p) for p in patches))


@torch.no_grad()
def caption_losses(model: torch.nn.Module, batches: list[Any], tok: Any) -> dict[str, Any]:
    """Mean caption-token loss with the right images and with the deranged ones."""
    from torchtitan.models.vlm.spec import vlm_inputs

    if not batches:
        raise ValueError(
            f"the held-out recipe gave no full step of {EVAL_ROWS} rows: hold out more scenes"
        )
    own: list[list[np.ndarray]] = []
    for batch in batches:
        im = batch.images
        off = im.patch_offsets().tolist()
        own.append([im.patches[off[k] : off[k + 1]].numpy() for k in range(im.num_images)])
    flat = [p for per in own for p in per]
    grids = [tuple(int(v) for v in g) for b in batches for g in b.images.grids.tolist()]
    perm = derangement(grids)
    totals = {"right": 0.0, "shuffled": 0.0}
    tokens, first = 0, 0
    for batch, patches in zip(batches, own, strict=True):
        n = len(patches)
        swapped = [flat[perm[first + k]] for k in range(n)]
        first += n
        mask = caption_mask(batch.labels, tok)
        tokens += int(mask.sum())
        for name, pixels in (("right", patches), ("shuffled", swapped)):
            mb = dataclasses.replace(batch, images=with_pixels(batch.images, pixels))
            logits = model(**vlm_inputs(mb, torch.device("cpu"))).float()
            loss = torch.nn.functional.cross_entropy(
                logits[mask], batch.labels[mask], reduction="sum"
            )
            totals[name] += float(loss.double())
    return {
        "loss_right_image": totals["right"] / tokens,
        "loss_shuffled_images": totals["shuffled"] / tokens,
        "caption_tokens": tokens,
        "images": len(flat),
        "grids": len(set(grids)),
        "images_moved": sum(p != i for i, p in enumerate(perm)),
    }


def load_model_args_only(vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """The vlm debugmodel as the trainer builds it on CPU, freshly initialised."""
    from torchtitan.models.vlm.args import get_model_args
    from torchtitan.models.vlm.model import VisionLanguageModel

    args = get_model_args("debugmodel", vocab_size=vocab_size, attention="doc_causal")
    model = VisionLanguageModel(dataclasses.replace(args, attention_impl="dense"))
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.eval()


def load_final_model(dump: Path, vocab_size: int) -> torch.nn.Module:
    """The vlm debugmodel with the run's last checkpoint, in this one process."""
    from torchtitan.components.initial_load import read_step_model

    model = load_model_args_only(vocab_size)
    model.load_state_dict(read_step_model(str(dump / "checkpoint")), strict=True)
    return model


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    started = time.perf_counter()
    train_recipe, held_recipe = build_corpus(work, args.train_images, args.heldout)
    corpus_s = time.perf_counter() - started
    dump = work / "run"
    if dump.exists():
        shutil.rmtree(dump)
    cli = ["--job.config_file", str(CONFIG), "--data.recipe", str(train_recipe)]
    cli += ["--training.steps", str(args.steps)]
    _, train_s = run_logged(args.nproc, dump, cli, timeout=3600)
    records = read_metrics(dump)
    steps = sorted(records)
    batches, tok = heldout_batches(held_recipe)
    eval_started = time.perf_counter()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = load_final_model(dump, tok.vocab_size)
    probe = caption_losses(model, batches, tok)
    eval_s = time.perf_counter() - eval_started
    reduction = 1 - probe["loss_right_image"] / probe["loss_shuffled_images"]
    return {
        "title": "Caption probe: the vlm debugmodel's caption loss on held-out scenes, "
        "with each caption's own image and with the images shuffled",
        "config": {
            "job_config": str(CONFIG.relative_to(REPO)),
            "nproc": args.nproc,
            "steps": len(steps),
            "train_images": args.train_images,
            "heldout_images": args.heldout,
            "train_seed": TRAIN_SEED,
            "heldout_seed": HELDOUT_SEED,
            "seq_len": 256,
            "max_placeholders_per_image": 16,
        },
        "training": {
            "tokens": sum(sum(r["source_tokens"].values()) for r in records.values()),
            "images_seen": sum(r["source_docs"]["captions"] for r in records.values()),
            "first_loss": records[steps[0]]["loss"],
            "final_loss": records[steps[-1]]["loss"],
            "wall_s": round(train_s, 1),
        },
        "probe": {
            **probe,
            "ratio_right_to_shuffled": probe["loss_right_image"] / probe["loss_shuffled_images"],
            "reduction": reduction,
        },  # fmt: skip
        "target_reduction": TARGET,
        "passed": reduction >= TARGET,
        "timing_s": {"corpus": round(corpus_s, 1), "eval": round(eval_s, 1)},
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads in eval; "
        "a shared 2-core machine",
    }


def table(doc: dict[str, Any]) -> str:
    """The figures QUOTED_IN quotes."""
    p, t, c = doc["probe"], doc["training"], doc["config"]
    verdict = "target met" if doc["passed"] else "target missed"
    return (
        "| caption loss on held-out scenes | value |\n|---|---|\n"
        f"| with each caption's own image | {p['loss_right_image']:.3f} |\n"
        f"| with the images shuffled (same tokens) | {p['loss_shuffled_images']:.3f} |\n"
        f"| ratio right / shuffled | {p['ratio_right_to_shuffled']:.3f} "
        f"({100 * p['reduction']:.1f}% lower; {verdict}: "
        f">= {100 * doc['target_reduction']:.0f}%) |\n"
        f"| training | {c['steps']} steps, {t['tokens']:,} tokens, {t['images_seen']:,} "
        f"captioned images, {t['wall_s']:.0f} s on {c['nproc']} CPU processes |\n"
    )


def page(doc: dict[str, Any]) -> str:
    p, c, t = doc["probe"], doc["config"], doc["training"]
    return (
        f"# {doc['title']}\n\n"
        "Generated by `scripts/experiments/vlm_caption_probe.py` from `vlm_caption_probe.json`.\n\n"
        f"{table(doc)}\n"
        f"- Training: `{c['job_config']}`, {c['train_images']:,} generated scenes (seed "
        f"{c['train_seed']}), loss {t['first_loss']:.3f} at step 1, {t['final_loss']:.3f} at "
        f"step {c['steps']}.\n"
        f"- Held out: {c['heldout_images']} scenes from seed {c['heldout_seed']}, never "
        f"trained on; {p['images']} of them in the evaluated batches (the loader's full "
        f"steps of {EVAL_ROWS} rows; it stops when its lane runs dry), {p['caption_tokens']:,} "
        f"caption tokens (targets that are caption text, not image tokens, BOS or EOS).\n"
        f"- Shuffled: a fixed derangement within each of the {p['grids']} patch grids "
        f"({p['images_moved']} of {p['images']} images moved), so both measurements have "
        "the same tokens, placeholders and positions; only the pixels differ.\n"
        f"- Machine: {doc['machine']}; corpus {doc['timing_s']['corpus']} s, "
        f"evaluation {doc['timing_s']['eval']} s.\n"
    )


def publish(path: Path) -> int:
    """The page beside a results JSON and, for the committed results, the summary
    in QUOTED_IN. Exit status 2 if the JSON is unreadable."""
    code = render_results(path, page)
    if code or path.resolve() != RESULTS.resolve():
        return code
    quote_in_page(QUOTED_IN, "vlm_caption_probe", table(json.loads(path.read_text())))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--train-images", type=int, default=4000)
    ap.add_argument("--heldout", type=int, default=400)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--work", default=str(REPO / "outputs" / "vlm_caption_probe"))
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--render", metavar="JSON", help="only regenerate the page from a JSON")
    args = ap.parse_args()
    if args.render:
        return publish(Path(args.render))
    doc = run(args)
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    publish(out)
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
