"""`python -m zephon validate | preview | hash | inspect | mixture`.

Every command follows the recipe's phases: validate checks each phase for
each data-parallel size given, preview and hash cross phase boundaries (at a
lane-count change the simulated ranks get the merged state, as a trainer
gives it), inspect shows a state's phase, carried documents and lane-count
changes, and mixture sets the realised mixture against the schedule."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from zephon.batch import Batch
from zephon.digest import global_batch_digest
from zephon.errors import LayoutError, ZephonError
from zephon.lanes.shuffle import SourceShuffle
from zephon.loader import ZephonLoader
from zephon.recipe.layout import resolve_layout
from zephon.recipe.load import load_recipe
from zephon.recipe.phases import PhaseTimeline, images_too_long, resolve_phases
from zephon.schema.recipe import Recipe, SourceSpec
from zephon.sources import SourceReader
from zephon.state.checkpoint_state import load_file, merge_rank_states
from zephon.tokenize.tokenizer import load_tokenizer

DEFAULT_TOKENIZER = str(
    Path(__file__).resolve().parents[2] / "assets" / "tokenizer" / "tokenizer.json"
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


def _sizes(text: str) -> list[int]:
    return [_positive(t) for t in text.split(",")]


SEQ_LEN, GLOBAL_BATCH = 256, 32  # the first phase's, unless the recipe sets them


def _shape_args(p: argparse.ArgumentParser, dp: bool = True, sizes: bool = False) -> None:
    p.add_argument("recipe", help="data recipe TOML")
    p.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="tokenizer.json or its folder")
    p.add_argument("--seq-len", type=_positive, default=None, help=f"default {SEQ_LEN}")
    p.add_argument(
        "--global-batch",
        type=_positive,
        default=None,
        help=f"rows per step, default {GLOBAL_BATCH}",
    )
    if sizes:
        p.add_argument(
            "--dp", type=_sizes, default=[1], help="data-parallel sizes to check, e.g. 1,2,4"
        )
    elif dp:
        p.add_argument("--dp", type=_positive, default=1, help="data-parallel size to simulate")
    if dp or sizes:
        p.add_argument("--micro-batch", type=_positive, default=None, help="rows per micro-batch")
    p.add_argument("--workers", type=int, default=None, help="override the recipe's workers")
    p.add_argument("--prefetch", type=int, default=None, help="override the recipe's prefetch")


def _shape(a: argparse.Namespace) -> tuple[int, int, tuple[str, ...]]:
    """seq_len, global batch size and which of them were given (the first phase's
    unless the recipe sets them; given and set differently is an error)."""
    given = tuple(
        k for k, v in (("seq_len", a.seq_len), ("global_batch_size", a.global_batch)) if v
    )
    return a.seq_len or SEQ_LEN, a.global_batch or GLOBAL_BATCH, given


def _schedule(recipe: Recipe, a: argparse.Namespace) -> PhaseTimeline:
    seq_len, batch, given = _shape(a)
    return resolve_phases(recipe, seq_len, batch, given)


def _print_phases(
    timeline: PhaseTimeline, sizes: list[int], micro: int | None, max_idle_share: float = 1.0
) -> int:
    """Each phase and its layout for each size; returns how many do not fit."""
    bad = 0
    flush_starts = {seg.start_step for seg in timeline.segments}
    for p in timeline.phases:
        end = f"{p.end_step}" if p.end_step is not None else "end"
        weights = " ".join(f"{n} {w / sum(p.weights):.3f}" for n, w in p.weights_by_name.items())
        cut = "" if p.start_step in flush_starts else " (batch size only: lanes go on)"
        print(
            f"phase     {p.name}: steps {p.start_step + 1}..{end}, global_batch="
            f"{p.global_batch_size} seq_len={p.seq_len} lanes={p.lanes}{cut}; {weights}"
        )
        for d in sizes:
            try:
                layout = resolve_layout(
                    p.lanes, d, p.global_batch_size, micro, max_idle_share, p.lanes_setting
                )
                print(f"  dp={d}: {layout.describe()}")
                if note := layout.imbalance():
                    print(f"    imbalance {note}")
            except LayoutError as exc:
                bad += 1
                print(f"  dp={d}: error: {exc}")
    return bad


def cmd_validate(a: argparse.Namespace) -> int:
    recipe = load_recipe(a.recipe)
    timeline = _schedule(recipe, a)
    lanes = recipe.lanes
    first = timeline.phases[0]
    layouts = (
        []
        if timeline.named
        else [
            resolve_layout(lanes, d, first.global_batch_size, a.micro_batch, a.max_idle_share)
            for d in a.dp
        ]
    )
    tok = load_tokenizer(a.tokenizer, recipe.tokenizer, recipe.path)
    bos = f", bos {tok.bos_id} prepended" if tok.add_bos else ""
    print(
        f"recipe    {recipe.path}  (sha256 {recipe.digest()[:16]}, bad_records={recipe.bad_records})"
    )
    print(
        f"tokenizer {a.tokenizer}  (vocab {tok.vocab_size}, eos {tok.eos_id}, pad {tok.pad_id}"
        f"{bos})"
    )
    for layout in layouts:
        print(f"layout    {layout.describe()} seq_len={first.seq_len}")
        for r in range(layout.dp_size):
            ids = layout.lanes_of(r)
            print(
                f"  rank {r}: lanes {ids.start}..{ids.stop - 1}, {layout.rows_of(r)} rows"
                + (f" + {layout.padded_rows(r)} padding" if layout.padded_rows(r) else "")
            )
        if note := layout.imbalance():
            print(f"imbalance {note}")
    bad = _print_phases(timeline, a.dp, a.micro_batch, a.max_idle_share) if timeline.named else 0
    total_w = sum(s.weight for s in recipe.sources)
    print(f"mixture   unit={recipe.mixture.unit}")
    for s in recipe.sources:
        reader = SourceReader(s, recipe.execution.cache_dir or None)
        order = SourceShuffle(
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
            if order.per_lane_walk
            else f"{order.num_blocks} blocks of {order.block_size}"
        )
        weight = "" if timeline.named else f"weight {s.weight / total_w:.3f}, "
        print(
            f"  {s.name}: {s.format}, {len(s.paths)} file(s), {reader.num_docs} docs, {kind}, "
            f"{weight}on_exhausted={s.on_exhausted}, {blocks}"
        )
    p = recipe.packing
    print(
        f"packing   {p.algorithm} flush_interval={p.flush_interval} rows"
        + (f" open_bins={p.open_bins}" if p.algorithm == "best_fit" else "")
    )
    too_long = images_too_long(recipe, timeline)
    drop = recipe.bad_records == "drop"
    for line in too_long:
        left_out = '; bad_records = "drop": such images are left out' if drop else ""
        print(f"images    {line}{left_out}")
    if bad:
        raise LayoutError(
            f"{bad} phase and data-parallel size combination(s) do not fit (listed above)"
        )
    if too_long and not drop:
        raise ZephonError(
            f"{len(too_long)} phase(s) cannot hold the largest image [image] allows (listed "
            'above): with bad_records = "error" training stops at the first image that large'
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
    from zephon.tools.scan import scan_recipe

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


def _print_row(
    tok: object,
    ids: list[int],
    pos: list[int],
    labels: list[int],
    head: str,
    chars: int,
    images: dict[int, tuple[int, str]] | None = None,
) -> None:
    """One row, document by document; `images`: (tokens, description) of each image
    by the input position of its start token (shown in place of its tokens)."""
    images = images or {}
    pad = [label == -100 for label in labels]
    # Input token t is padding iff label t-1 is ignored and it is no image token
    # (image tokens are ignored targets too); padding has position 0 (clamped), so
    # it must not start a segment per token.
    in_image = _image_spans(images, ids)
    is_pad = [False] + [p and not in_image[t + 1] for t, p in enumerate(pad[:-1])]
    segments, cur = [], [0]
    for t in range(1, len(ids)):
        if (pos[t] == 0 and not is_pad[t]) or (is_pad[t] and not is_pad[t - 1]):
            segments.append(cur)
            cur = []
        cur.append(t)
    segments.append(cur)
    n_pad = sum(is_pad)
    docs = len(segments) - (1 if n_pad else 0)
    shown = f", {len(images)} image(s)" if images else ""
    print(f"--- {head}: {docs} segment(s), {sum(pad)} ignored labels{shown}")
    for k, seg in enumerate(segments):
        if n_pad and k == len(segments) - 1:
            print(f"  [{len(seg)} tok] (padding)")
            continue
        text = _segment_text(tok, ids, seg, images, in_image)
        print(f"  [{len(seg)} tok] {text[:chars]!r}")


def _image_spans(images: dict[int, tuple[int, str]], ids: list[int]) -> list[bool]:
    """Whether each input position belongs to an image's tokens (start to end)."""
    inside = [False] * len(ids)
    for first, (n, _) in images.items():
        for t in range(first, min(first + n, len(ids))):
            inside[t] = True
    return inside


def _segment_text(
    tok: object,
    ids: list[int],
    seg: list[int],
    images: dict[int, tuple[int, str]],
    inside: list[bool],
) -> str:
    """The segment decoded, each image shown as `<its description>`."""
    out, run = [], []
    for t in seg:
        if t in images:
            out.append(tok.decode(run, skip_special_tokens=False))  # type: ignore[attr-defined]
            out.append(f"<{images[t][1]}>")
            run = []
        elif not inside[t]:
            run.append(ids[t])
    out.append(tok.decode(run, skip_special_tokens=False))  # type: ignore[attr-defined]
    return "".join(out)


def _row_images(batch: Batch, row: int) -> dict[int, tuple[int, str]]:
    """Row `row`'s images of a batch: input position of each start token -> (its
    tokens, what it is)."""
    im = batch.images
    if im is None:
        return {}
    out = {}
    for k in (im.rows == row).nonzero().flatten().tolist():
        (h, w), n, s = im.grids[k].tolist(), int(im.tokens()[k]), int(im.starts[k])
        out[s - 1] = (n + 2, f"image {h}x{w} patches, {n + 2} tokens at {s - 1}..{s + n}")
    return out


def cmd_preview(a: argparse.Namespace) -> int:
    recipe = load_recipe(a.recipe)
    timeline = _schedule(recipe, a)
    lanes = max(p.lanes for p in timeline.phases)
    if not 0 <= a.lane < lanes:
        raise ZephonError(f"--lane {a.lane} is outside [0, {lanes})")
    seq_len, batch, given = _shape(a)
    if timeline.named:  # every lane, across the phases (the lane count may change)
        loader = ZephonLoader(
            recipe, a.tokenizer, seq_len, batch, num_workers=a.workers, prefetch=0, explicit=given
        )
    else:  # one lane per simulated rank, so rank == lane: only that lane is built
        loader = ZephonLoader(
            recipe, a.tokenizer, seq_len, lanes, 1, a.lane, lanes, num_workers=a.workers, prefetch=0
        )
    tok = loader.tok.tokenizer
    shown = 0
    try:
        while shown < a.rows:
            b = loader.next_batch()
            per = b.num_rows // len(b.digests)
            if not timeline.named:
                rows = range(b.num_rows)  # the simulated rank's one lane
            elif a.lane < len(b.digests):
                rows = range(per * a.lane, per * (a.lane + 1))
            else:
                rows = range(0)  # a phase with fewer lanes
            for i in rows:
                if shown == a.rows:
                    break
                head = f"lane {a.lane} row {shown}"
                if timeline.named:
                    head += f" (phase {b.phase}, step {b.step + 1})"
                ids, pos = b.input_ids[i].tolist(), b.positions[i].tolist()
                labels, images = b.labels[i].tolist(), _row_images(b, i)
                _print_row(tok, ids, pos, labels, head, a.chars, images)
                shown += 1
    except StopIteration:
        print(f"data ended after {shown} rows")
    finally:
        loader.close()
    return 0


def _steps(loaders: list[ZephonLoader], steps: int) -> Iterator[list[Batch]]:
    """Each step's batches of the simulated ranks; at a lane-count change every rank
    gets the merged state first, as a trainer gives it."""
    for _ in range(steps):
        if any(loader.needs_boundary_state for loader in loaders):
            merged = merge_rank_states([loader.state_dict() for loader in loaders])
            for loader in loaders:
                loader.load_state_dict(merged)
        yield [loader.next_batch() for loader in loaders]


def _ranks(a: argparse.Namespace, recipe: Recipe, dp: int) -> list[ZephonLoader]:
    tok = load_tokenizer(a.tokenizer, recipe.tokenizer, recipe.path)
    seq_len, batch, given = _shape(a)
    return [
        ZephonLoader(
            recipe,
            tok,
            seq_len,
            batch,
            getattr(a, "micro_batch", None),
            r,
            dp,
            num_workers=a.workers,
            prefetch=a.prefetch,
            explicit=given,
        )
        for r in range(dp)
    ]


def cmd_hash(a: argparse.Namespace) -> int:
    recipe = load_recipe(a.recipe)
    loaders = _ranks(a, recipe, a.dp)
    step = 0
    try:
        for batches in _steps(loaders, a.steps):
            digest = global_batch_digest([d for b in batches for d in b.digests])
            phase = f" {batches[0].phase}" if batches[0].phase is not None else ""
            print(f"step {step} {digest}{phase}")
            step += 1
    except StopIteration:
        print(f"data ended after {step} steps")
    finally:
        for loader in loaders:
            loader.close()
    return 0


def cmd_mixture(a: argparse.Namespace) -> int:
    from zephon.tools.mixture_report import measure, plot, table

    recipe = load_recipe(a.recipe)
    loaders = _ranks(a, recipe, 1)
    try:
        rows = measure(
            loaders[0].timeline, _steps(loaders, a.steps), recipe.mixture.unit == "documents"
        )
    except StopIteration:
        raise ZephonError(f"the data ended before step {a.steps}") from None
    finally:
        loaders[0].close()
    for line in table(rows):
        print(line)
    if a.plot:
        plot(rows, a.plot, f"{recipe.name}: realised mixture by {recipe.mixture.unit}")
        print(f"plot      {a.plot}")
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
        carry = "".join(f" carry {n}#{d}+{off}" for n, d, off in flush.get("carry", []))
        print(
            f"  lane {k}: flush row {flush['row']} +{entry['rows_since_flush']} rows, "
            f"skip {flush['skip_tokens']} tok, {srcs}{carry}"
        )
    if "phase" in state:
        names = ", ".join(f"{p['name']} (from step {p['start_step']})" for p in fp["phases"])
        print(f"phases started: {names}")
        at = (
            f"; the boundary checkpoint of phase {state['boundary_of']}"
            if "boundary_of" in state
            else ""
        )
        print(
            f"lanes: {state['num_lanes']}, in their segment since step {state['segment_start']}{at}"
        )
    for name, chain in state.get("deals", {}).items():
        for rec in chain:
            print(
                f"deal {name}: phase {rec['phase']}, {rec['lanes_before']} -> "
                f"{rec['lanes_after']} lanes, old lanes' epochs "
                f"{sorted({e for e, _, _ in rec['cursors']})}"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zephon", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check a recipe and every phase's layout; print the plan")
    _shape_args(p, sizes=True)
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
    p = sub.add_parser("mixture", help="the realised mixture against the schedule, per step")
    _shape_args(p, dp=False)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--plot", default="", help="write a PNG of it here")
    p.set_defaults(fn=cmd_mixture)
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
