"""`python -m zephon validate | preview | hash | inspect`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from zephon.digest import global_batch_digest
from zephon.errors import ZephonError
from zephon.layout import plan_layout
from zephon.loader import ZephonLoader
from zephon.recipe import Recipe, SourceSpec, load_recipe
from zephon.shuffle import SourcePlan
from zephon.sources import SourceReader
from zephon.state import load_file
from zephon.tokenize import load_tokenizer

DEFAULT_TOKENIZER = str(
    Path(__file__).resolve().parents[1] / "assets" / "tokenizer" / "tokenizer.json"
)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1], got {text!r}")
    return value


def _shape_args(p: argparse.ArgumentParser, dp: bool = True) -> None:
    p.add_argument("recipe", help="data recipe TOML")
    p.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="tokenizer.json or its folder")
    p.add_argument("--seq-len", type=_positive, default=256)
    p.add_argument("--global-batch", type=_positive, default=32, help="rows per step, all ranks")
    if dp:
        p.add_argument("--dp", type=_positive, default=1, help="data-parallel size to simulate")
        p.add_argument("--micro-batch", type=_positive, default=None, help="rows per micro-batch")
    p.add_argument("--workers", type=int, default=None, help="override the recipe's workers")
    p.add_argument("--prefetch", type=int, default=None, help="override the recipe's prefetch")


def cmd_validate(a: argparse.Namespace) -> int:
    recipe = load_recipe(a.recipe)
    lanes = recipe.lanes
    layout = plan_layout(lanes, a.dp, a.global_batch, a.micro_batch, a.max_idle_share)
    tok = load_tokenizer(a.tokenizer, recipe.tokenizer, recipe.path)
    bos = f", bos {tok.bos_id} prepended" if tok.add_bos else ""
    print(
        f"recipe    {recipe.path}  (sha256 {recipe.digest()[:16]}, bad_records={recipe.bad_records})"
    )
    print(
        f"tokenizer {a.tokenizer}  (vocab {tok.vocab_size}, eos {tok.eos_id}, pad {tok.pad_id}"
        f"{bos})"
    )
    print(f"layout    {layout.describe()} seq_len={a.seq_len}")
    for r in range(a.dp):
        ids = layout.lanes_of(r)
        print(
            f"  rank {r}: lanes {ids.start}..{ids.stop - 1}, {layout.rows_of(r)} rows"
            + (f" + {layout.padded_rows(r)} padding" if layout.padded_rows(r) else "")
        )
    if note := layout.imbalance():
        print(f"imbalance {note}")
    total_w = sum(s.weight for s in recipe.sources)
    print(f"mixture   unit={recipe.mixture.unit}")
    for s in recipe.sources:
        reader = SourceReader(s, recipe.execution.cache_dir or None)
        plan = SourcePlan(
            s.name, reader.num_docs, lanes, recipe.shuffle.block_size, recipe.seed, True
        )
        kind = (
            f"pretokenized '{s.token_field or 'token arrays'}'"
            if s.pretokenized
            else _image_kind(s)
            if s.multimodal
            else f"text '{s.text_field}'"
        )
        blocks = (
            "fewer documents than lanes: each lane walks all of them per epoch"
            if plan.per_lane_walk
            else f"{plan.num_blocks} blocks of {plan.block_size}"
        )
        print(
            f"  {s.name}: {s.format}, {len(s.paths)} file(s), {reader.num_docs} docs, {kind}, "
            f"weight {s.weight / total_w:.3f}, on_exhausted={s.on_exhausted}, {blocks}"
        )
    p = recipe.packing
    print(
        f"packing   {p.algorithm} flush_interval={p.flush_interval} rows"
        + (f" open_bins={p.open_bins}" if p.algorithm == "best_fit" else "")
    )
    if a.scan:
        return _scan(recipe, tok.vocab_size, a.scan_workers)
    print("ok")
    return 0


def _image_kind(s: SourceSpec) -> str:
    """What a source with images holds, in the words of its recipe fields."""
    if s.images_field:
        return f"interleaved texts '{s.texts_field}' and images '{s.images_field}'"
    if s.format == "webdataset":
        image = s.image_field or "jpg/jpeg/png/webp"
        return f"image member {image} with text from txt or json '{s.text_field}'"
    return f"image '{s.image_field}' with text '{s.text_field}'"


def _scan(recipe: Recipe, vocab_size: int, workers: int | None) -> int:
    from zephon.scan import scan_recipe

    read, bad = scan_recipe(recipe, vocab_size, workers, progress=sys.stderr.isatty())
    print(f"scan      {read} records read, {len(bad)} bad")
    for r in bad:
        print(f"  {r.message}")
    if bad:
        raise ZephonError(
            f"{len(bad)} bad record(s) in {recipe.path} (listed above); fix them, or set "
            'bad_records = "drop" in [recipe] to train with them as empty documents'
        )
    print("ok")
    return 0


def cmd_preview(a: argparse.Namespace) -> int:
    recipe = load_recipe(a.recipe)
    lanes = recipe.lanes
    if not 0 <= a.lane < lanes:
        raise ZephonError(f"--lane {a.lane} is outside [0, {lanes})")
    dp = lanes  # one lane per simulated rank, so rank == lane
    loader = ZephonLoader(
        recipe, a.tokenizer, a.seq_len, lanes, 1, a.lane, dp, num_workers=a.workers, prefetch=0
    )
    tok = loader.tok.tokenizer
    try:
        for r in range(a.rows):
            batch = loader.next_batch()
            ids = batch.input_ids[0].tolist()
            pos = batch.positions[0].tolist()
            pad = (batch.labels[0] == -100).tolist()
            # Input token t is padding iff label t-1 is ignored; padding has position 0
            # (clamped), so it must not start a segment per token.
            is_pad = [False] + pad[:-1]
            segments, cur = [], [ids[0]]
            for t in range(1, len(ids)):
                if (pos[t] == 0 and not is_pad[t]) or (is_pad[t] and not is_pad[t - 1]):
                    segments.append(cur)
                    cur = []
                cur.append(ids[t])
            segments.append(cur)
            n_pad = sum(is_pad)
            docs = len(segments) - (1 if n_pad else 0)
            print(f"--- lane {a.lane} row {r}: {docs} segment(s), {sum(pad)} ignored labels")
            for k, seg in enumerate(segments):
                if n_pad and k == len(segments) - 1:
                    print(f"  [{len(seg)} tok] (padding)")
                    continue
                text = tok.decode(seg, skip_special_tokens=False)
                print(f"  [{len(seg)} tok] {text[: a.chars]!r}")
    finally:
        loader.close()
    return 0


def cmd_hash(a: argparse.Namespace) -> int:
    recipe = load_recipe(a.recipe)
    tok = load_tokenizer(a.tokenizer)
    loaders = [
        ZephonLoader(
            recipe,
            tok,
            a.seq_len,
            a.global_batch,
            a.micro_batch,
            r,
            a.dp,
            num_workers=a.workers,
            prefetch=a.prefetch,
        )
        for r in range(a.dp)
    ]
    try:
        for step in range(a.steps):
            digests: list[bytes] = []
            for loader in loaders:
                digests.extend(loader.next_batch().digests)
            print(f"step {step} {global_batch_digest(digests)}")
    except StopIteration:
        print(f"data ended after {step} steps")
    finally:
        for loader in loaders:
            loader.close()
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    state = load_file(a.state)
    try:
        _print_state(a, state)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ZephonError(
            f"{a.state}: malformed loader state ({type(exc).__name__}: {exc})"
        ) from None
    return 0


def _print_state(a: argparse.Namespace, state: dict) -> None:
    size = os.path.getsize(a.state)
    lanes = state["lanes"]
    fp = state["fingerprint"]
    print(f"{a.state}: {state['format']} v{state['version']}, step {state['step']}")
    print(f"size {size} bytes, {size / max(len(lanes), 1):.0f} bytes per lane")
    print("fingerprint " + json.dumps(fp, sort_keys=True))
    for k, entry in lanes.items():
        flush = entry["flush"]
        srcs = " ".join(
            f"{n}:e{v['epoch']}/{v['pos']}{'(retired)' if v['retired'] else ''}"
            for n, v in flush["sources"].items()
        )
        print(
            f"  lane {k}: flush row {flush['row']} +{entry['rows_since_flush']} rows, "
            f"skip {flush['skip_tokens']} tok, {srcs}"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zephon", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check a recipe and a layout; print the plan")
    _shape_args(p)
    p.add_argument(
        "--max-idle-share",
        type=_share,
        default=1.0,
        help="refuse a layout whose padding rows exceed this share of the rows run (0..1)",
    )
    p.add_argument("--scan", action="store_true", help="read every record; list all bad ones")
    p.add_argument("--scan-workers", type=_positive, default=None, help="scan processes")
    p.set_defaults(fn=cmd_validate)
    p = sub.add_parser("preview", help="decode the first rows of one lane")
    _shape_args(p, dp=False)
    p.add_argument("--lane", type=int, default=0)
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--chars", type=int, default=100, help="characters shown per segment")
    p.set_defaults(fn=cmd_preview)
    p = sub.add_parser("hash", help="simulate --dp ranks and print each step's global digest")
    _shape_args(p)
    p.add_argument("--steps", type=int, default=10)
    p.set_defaults(fn=cmd_hash)
    p = sub.add_parser("inspect", help="summarise a saved loader state (JSON)")
    p.add_argument("state")
    p.set_defaults(fn=cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ZephonError as exc:
        print(f"zephon {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
