"""Parse: a recipe's TOML document into a `Recipe` whose sources are not yet resolved.

Every table is read strictly (zephon/schema/toml.py): unknown keys, wrong types
and values out of their range are refused with the file, the line, the table
and the key. What a value means across tables (names, formats, phases) is
check.py's; where a source's files are, resolve.py's. Nothing here touches
storage: a source keeps its `path` as written (`SourceSpec.patterns`), and its
`format` may still be "auto".
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from zephon.errors import RecipeError
from zephon.schema.recipe import (
    BAD_RECORDS,
    EXHAUSTION,
    HF_BUILDERS,
    IMAGE_DECODES,
    MIX_UNITS,
    PACKERS,
    ExecutionSpec,
    ImageSpec,
    MixtureSpec,
    PackingSpec,
    PhaseSpec,
    Recipe,
    ShuffleSpec,
    SourceSpec,
    TokenizerSpec,
)
from zephon.schema.toml import KeyLines, Table


class Reader:
    """The tables of one recipe file, read with its key lines."""

    def __init__(self, file: str, lines: KeyLines | None = None):
        self.file, self.lines = file, lines or {}

    def table(
        self, where: str, data: Any, spec: type | None = None, path: str | None = None
    ) -> Table:
        """`path`: the table as the file writes it ("source[0]"; default `where`)."""
        return Table(self.file, where, data, RecipeError, self.lines, spec, path)

    def at(self, path: str, key: str = "") -> str:
        """`file:line` of a key (or of its table), or the file alone."""
        line = self.lines.get((path, key)) or self.lines.get((path, ""))
        return f"{self.file}:{line}" if line else self.file


def parse_recipe(data: dict[str, Any], file: str, lines: KeyLines | None = None) -> Recipe:
    """The recipe `data` (TOML, from `file`) says, its sources unresolved."""
    r = Reader(file, lines)
    top = r.table("recipe file", data, path="")
    head = r.table("recipe", top.get("recipe", dict, {}))
    name = head.get("name", str, Path(file).stem)
    seed = head.get("seed", int, 0)
    lanes_set = "lanes" in head.data
    lanes = head.positive_int("lanes", 8)
    bad_records = head.choice("bad_records", BAD_RECORDS, "error")
    head.finish()

    m = r.table("mixture", top.get("mixture", dict, {}), MixtureSpec)
    mixture = MixtureSpec(
        unit=m.choice("unit", MIX_UNITS), on_exhausted=m.choice("on_exhausted", EXHAUSTION)
    )
    m.finish()

    s = r.table("shuffle", top.get("shuffle", dict, {}), ShuffleSpec)
    shuffle = ShuffleSpec(enabled=s.get("enabled", bool), block_size=s.positive_int("block_size"))
    s.finish()

    p = r.table("packing", top.get("packing", dict, {}), PackingSpec)
    packing = PackingSpec(
        algorithm=p.choice("algorithm", PACKERS),
        open_bins=p.positive_int("open_bins"),
        flush_interval=p.positive_int("flush_interval"),
    )
    p.finish()

    execution = _parse_execution(r, top.get("execution", dict, {}))

    k = r.table("tokenizer", top.get("tokenizer", dict, {}), TokenizerSpec)
    tokenizer = TokenizerSpec(
        eos=k.get("eos", str), bos=k.get("bos", str), pad=k.get("pad", str),
        add_bos=k.get("add_bos", bool),
    )  # fmt: skip
    k.finish()

    image = _parse_image(r, top.get("image", dict, {}))
    storage = _parse_storage(r, top.get("storage", dict, {}))
    raw_sources = top.get("source", list, [])
    if not raw_sources:
        raise RecipeError(f"{file}: no [[source]] tables: a recipe needs at least one source")
    sources = tuple(
        _parse_source(r, i, raw, mixture.on_exhausted, storage) for i, raw in enumerate(raw_sources)
    )
    names = [src.name for src in sources]
    phases = tuple(
        _parse_phase(r, i, raw, names) for i, raw in enumerate(top.get("phase", list, []))
    )
    top.finish()
    first = phases[0].lanes if phases else None
    if first is not None and lanes_set and first != lanes:
        raise RecipeError(
            f"{file}: phase '{phases[0].name}'.lanes = {first} disagrees with [recipe] "
            f"lanes = {lanes}; set the first phase's lane count in one place"
        )
    return Recipe(
        path=os.path.abspath(file), name=name, seed=seed, lanes=first or lanes,
        sources=sources, mixture=mixture, shuffle=shuffle, packing=packing,
        execution=execution, tokenizer=tokenizer, image=image, bad_records=bad_records,
        phases=phases,
    )  # fmt: skip


def _parse_execution(r: Reader, raw: Any) -> ExecutionSpec:
    e = r.table("execution", raw, ExecutionSpec)
    cache_dir = e.get("cache_dir", str)
    if cache_dir:  # relative to the recipe folder, like source paths
        base = os.path.dirname(os.path.abspath(r.file))
        cache_dir = os.path.normpath(os.path.join(base, os.path.expanduser(cache_dir)))
    if "block_prefetch" in e.data:
        e.positive_int("block_prefetch", 4)  # still type-checked, then ignored
        warnings.warn(
            f"{r.file}: execution.block_prefetch is deprecated and ignored: lookahead is now "
            "one token budget per rank, [execution] lookahead_tokens",
            DeprecationWarning,
            stacklevel=3,
        )
    execution = ExecutionSpec(
        workers=e.positive_int("workers", minimum=0),
        prefetch=e.positive_int("prefetch", minimum=0),
        lookahead_tokens=e.positive_int("lookahead_tokens", minimum=0),
        lookahead_bytes=e.positive_int("lookahead_bytes", minimum=0),
        cache_dir=cache_dir,
    )
    e.finish()
    return execution


def _parse_source(
    r: Reader, index: int, raw: Any, default_exhaust: str, storage_defaults: dict[str, Any]
) -> SourceSpec:
    t = r.table(f"source[{index}]", raw, SourceSpec)
    name = t.get("name", str)
    if not name:
        raise t.err("name", "must not be empty")
    t.where = f"source '{name}'"
    fmt = t.get("format", str, "auto")
    storage = dict(storage_defaults)
    storage.update(t.get("storage_options", dict, {}))
    raw_path = t.get("path", (str, list))
    patterns = [raw_path] if isinstance(raw_path, str) else raw_path
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise t.err("path", "expected a path or a list of paths")
    weight = t.get("weight", float)
    if not math.isfinite(weight) or weight <= 0:
        raise t.err("weight", f"expected a positive number, got {weight}")
    spec = SourceSpec(
        name=name,
        paths=(),
        format=fmt,
        text_field=t.get("text_field", str),
        token_field=t.get("token_field", str),
        weight=weight,
        on_exhausted=t.choice("on_exhausted", EXHAUSTION, default_exhaust),
        hf_builder=t.choice("hf_builder", HF_BUILDERS),
        storage=json.dumps(storage, sort_keys=True) if storage else "",
        image_field=t.get("image_field", str),
        texts_field=t.get("texts_field", str),
        images_field=t.get("images_field", str),
        patterns=tuple(patterns),
    )
    t.finish()
    return spec


def _parse_storage(r: Reader, raw: Any) -> dict[str, Any]:
    """[storage]: fsspec options for remote paths (endpoint_url, cache_limit_gb, anything
    the protocol's file system accepts under [storage.options])."""
    t = r.table("storage", raw)
    out: dict[str, Any] = dict(t.get("options", dict, {}))
    endpoint = t.get("endpoint_url", str, "")
    if endpoint:
        out["endpoint_url"] = endpoint
    limit = t.get("cache_limit_gb", float, 0.0)
    if limit < 0 or not math.isfinite(limit):
        raise t.err("cache_limit_gb", f"expected a number >= 0, got {limit}")
    if limit:
        out["cache_limit_gb"] = limit
    t.finish()
    return out


def _parse_image(r: Reader, raw: Any) -> ImageSpec:
    """[image]: pixel settings; the background as [R, G, B] or "#rrggbb"."""
    t = r.table("image", raw, ImageSpec)
    values = {
        k: t.get(k, int)
        for k in ("patch_size", "merge", "min_pixels", "max_pixels", "max_decoded_pixels")
    }
    tokens = {k: t.get(k, str) for k in ("start_token", "pad_token", "end_token")}
    decode = t.choice("decode", IMAGE_DECODES)
    bg = t.get("background", (list, str))
    if isinstance(bg, str):
        hex_digits = bg[1:] if bg.startswith("#") else ""
        if len(hex_digits) != 6 or any(c not in "0123456789abcdefABCDEF" for c in hex_digits):
            raise t.err("background", f'expected "#rrggbb" or [R, G, B], got {bg!r}')
        bg = [int(hex_digits[i : i + 2], 16) for i in (0, 2, 4)]
    t.finish()
    try:
        return ImageSpec(**values, **tokens, background=tuple(bg), decode=decode)
    except ValueError as exc:  # "field: what was expected, got value"
        key, _, what = str(exc).partition(": ")
        raise t.err(key, what) from None


def _optional_positive(t: Table, key: str) -> int | None:
    value = t.get(key, int, None)
    if value is not None and value < 1:
        raise t.err(key, f"expected an integer >= 1, got {value}")
    return value


def _parse_weights(t: Table, names: list[str]) -> tuple[tuple[str, float], ...] | None:
    raw = t.get("weights", dict, None)
    if raw is None:
        return None
    out = []
    for key, value in raw.items():
        if key not in names:
            raise t.err("weights", f"unknown source {key!r}; declared sources: {', '.join(names)}")
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0:
            raise t.err("weights", f"{key}: expected a number >= 0, got {value!r}")
        out.append((key, float(value)))
    if not any(w > 0 for _, w in out):
        raise t.err("weights", "no source has a positive weight; at least one must")
    # Declaration order, so that equal tables give equal phases.
    return tuple(sorted(out, key=lambda kv: names.index(kv[0])))


def _parse_phase(r: Reader, index: int, raw: Any, names: list[str]) -> PhaseSpec:
    t = r.table(f"phase[{index}]", raw)
    name = t.get("name", str)
    if not name:
        raise t.err("name", "must not be empty")
    t.where = f"phase '{name}'"
    start = t.get("start_step", int)
    if start < 0:
        raise t.err("start_step", f"expected an integer >= 0, got {start}")
    phase = PhaseSpec(
        name=name,
        start_step=start,
        weights=_parse_weights(t, names),
        global_batch_size=_optional_positive(t, "global_batch_size"),
        seq_len=_optional_positive(t, "seq_len"),
        lanes=_optional_positive(t, "lanes"),
    )
    t.finish()
    return phase
