"""Data recipes: the TOML document that says what data a run trains on.

A recipe is parsed strictly: unknown keys, wrong types and bad values are
rejected at load time with a message naming the file and the key, so a typo
never silently falls back to a default. Relative paths resolve against the
recipe's own folder, so a recipe and its data can move together.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import tomllib
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from zephon.errors import RecipeError, ZephonError

# The source formats, their file suffixes and which may hold images or be folders come
# from their registry, zephon/sources/formats.py (see `_formats` below).
# The image members a WebDataset sample may have.
WDS_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
HF_BUILDERS = ("json", "parquet", "csv", "text", "arrow")
EXHAUSTION = ("repeat", "stop")
MIX_UNITS = ("tokens", "documents")
PACKERS = ("concat", "best_fit")
BAD_RECORDS = ("error", "drop")


# How a field enters the recipe's identity digest (docs/design.md §11,
# "Compatibility"). Fields that existed when digests were first pinned always
# enter, so those digests stay what they were; a field added later enters only
# when it is not at its default, so learning a new setting never changes the
# digest of a recipe that does not use it. Settings that say how data is
# reached or how fast, not what it is, never enter.
ALWAYS = {"identity": "always"}
NEVER = {"identity": "never"}


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def identity_of(spec: Any) -> dict[str, Any]:
    """The fields of a spec dataclass that enter the digest, by the rule above."""
    out: dict[str, Any] = {}
    for f in fields(spec):
        rule = f.metadata.get("identity", "if_set")
        if rule == "never":
            continue
        value = getattr(spec, f.name)
        if rule == "if_set" and value == _default(f):
            continue
        out[f.name] = identity_of(value) if hasattr(value, "__dataclass_fields__") else value
    return out


@dataclass(frozen=True)
class SourceSpec:
    name: str = field(metadata=ALWAYS)
    paths: tuple[str, ...] = field(metadata=ALWAYS)  # resolved, sorted, absolute
    format: str = field(metadata=ALWAYS)
    text_field: str = field(default="text", metadata=ALWAYS)
    # set for pretokenized input: a list of token ids
    token_field: str = field(default="", metadata=ALWAYS)
    weight: float = field(default=1.0, metadata=ALWAYS)
    on_exhausted: str = field(default="repeat", metadata=ALWAYS)
    hf_builder: str = field(default="json", metadata=ALWAYS)  # for format = "hf"
    # fsspec options for remote paths, as JSON ([storage] merged with the source's
    # storage_options). How the data is reached, not what it is: kept out of the digest.
    storage: str = field(default="", metadata=NEVER)
    # Image-text records (zephon/sources/multimodal.py). Parquet / Hugging Face: the
    # column of image bytes; WebDataset: which image member to take ("" = the one there is).
    image_field: str = ""
    # Interleaved documents (OBELICS style): parallel list columns, nulls where the other is.
    texts_field: str = ""
    images_field: str = ""

    @property
    def pretokenized(self) -> bool:
        return bool(self.token_field) or self.format == "tokens"

    @property
    def multimodal(self) -> bool:
        """Documents are MultimodalDoc records (text and image segments), not text."""
        return self.format == "webdataset" or bool(self.image_field or self.images_field)

    @property
    def storage_options(self) -> dict[str, Any]:
        return json.loads(self.storage) if self.storage else {}


@dataclass(frozen=True)
class MixtureSpec:
    unit: str = field(default="tokens", metadata=ALWAYS)
    on_exhausted: str = field(default="repeat", metadata=ALWAYS)


@dataclass(frozen=True)
class ShuffleSpec:
    enabled: bool = field(default=True, metadata=ALWAYS)
    # documents per shuffle block: the unit of work for workers
    block_size: int = field(default=128, metadata=ALWAYS)


@dataclass(frozen=True)
class PackingSpec:
    algorithm: str = field(default="concat", metadata=ALWAYS)
    open_bins: int = field(default=8, metadata=ALWAYS)  # best_fit only
    # rows between flush points; bounds replay on resume
    flush_interval: int = field(default=64, metadata=ALWAYS)


@dataclass(frozen=True)
class ExecutionSpec:
    """Performance knobs only: no value here may change a single output byte."""

    workers: int = 2
    prefetch: int = 2  # global steps produced ahead of the trainer
    # Tokens tokenized ahead of need, one budget for the rank (0 = two steps of its rows).
    lookahead_tokens: int = 0
    cache_dir: str = ""  # where document indexes are cached ("" = user cache)
    # Image bytes decoded ahead of need (decode peaks in flight, patches waiting),
    # one budget for the rank (0 = 512 MiB); sources with images only.
    lookahead_bytes: int = 0


# Pillow refuses images above twice its MAX_IMAGE_PIXELS (89478485) before we can.
PILLOW_PIXEL_LIMIT = 2 * 89_478_485


@dataclass(frozen=True)
class ImageSpec:
    """How image records become pixels and patches (DESIGN §14; zephon/images/).

    Every field decides pixels or token ids, so each enters the recipe digest,
    but only when set (the fields were added after digests were pinned). The defaults: 14-pixel
    patches merged 2 x 2 into one placeholder token, so an image is a whole number
    of 28 x 28 windows; at least 4 windows (56 x 56 pixels) and at most 1024
    (1024 placeholder tokens); images over 64 megapixels refused before decoding.
    """

    patch_size: int = 14
    merge: int = 2  # merge x merge patches become one placeholder token
    min_pixels: int = 4 * 28 * 28
    max_pixels: int = 1024 * 28 * 28
    max_decoded_pixels: int = 64_000_000  # larger images are refused from their header
    background: tuple[int, int, int] = (255, 255, 255)  # under transparent pixels
    # The tokenizer's own image start / placeholder / end tokens, by name; all
    # three or none. None: ids appended after the vocabulary (zephon/images/tokens.py).
    start_token: str = ""
    pad_token: str = ""
    end_token: str = ""

    def __post_init__(self) -> None:
        """Bad values raise ValueError('field: what was expected, got value')."""
        names = {k: getattr(self, k) for k in ("start_token", "pad_token", "end_token")}
        for name, value in names.items():
            if not isinstance(value, str):
                raise ValueError(f"{name}: expected a token of the tokenizer, got {value!r}")
        if any(names.values()) and not all(names.values()):
            unset = ", ".join(k for k, v in names.items() if not v)
            raise ValueError(
                f"{unset}: expected all of start_token, pad_token and end_token or none "
                f"(none: the image tokens are appended after the vocabulary), got {names}"
            )
        if all(names.values()) and len(set(names.values())) < 3:
            raise ValueError(f"start_token: the three image tokens must differ, got {names}")
        for name in ("patch_size", "merge", "min_pixels", "max_pixels", "max_decoded_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        window = self.window * self.window
        if self.max_pixels < window:
            raise ValueError(
                f"max_pixels: expected at least one merge window, (patch_size * merge)^2 = "
                f"{window}, got {self.max_pixels}"
            )
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"min_pixels: expected at most max_pixels ({self.max_pixels}), got {self.min_pixels}"
            )
        if self.max_decoded_pixels > PILLOW_PIXEL_LIMIT:
            raise ValueError(
                f"max_decoded_pixels: expected at most {PILLOW_PIXEL_LIMIT} (Pillow refuses "
                f"larger images itself), got {self.max_decoded_pixels}"
            )
        bg = self.background
        if not (
            isinstance(bg, tuple)
            and len(bg) == 3
            and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in bg)
        ):
            raise ValueError(f"background: expected three integers 0..255 (R, G, B), got {bg!r}")

    @property
    def window(self) -> int:
        """Side in pixels of one merge window: both sides of a resized image are multiples."""
        return self.patch_size * self.merge

    @property
    def largest_image_tokens(self) -> int:
        """Placeholder tokens of the largest image `max_pixels` allows (one per merge
        window; a long thin image reaches it exactly, zephon/images/pixels/resize.py)."""
        return self.max_pixels // (self.window * self.window)


@dataclass(frozen=True)
class TokenizerSpec:
    """Overrides of the special tokens a tokenizer (file or folder) gives.

    Empty / None means "as the tokenizer says"; see zephon.tokenize.tokenizer.load_tokenizer.
    """

    eos: str = ""
    bos: str = ""
    pad: str = ""
    add_bos: bool | None = None  # prepend BOS to every document

    def non_default(self) -> dict[str, Any]:
        """Only the fields that were set: what enters the recipe digest (docs/design.md §11)."""
        return identity_of(self)


@dataclass(frozen=True)
class PhaseSpec:
    """One `[[phase]]` table as written. None means "as the phase before"; for
    the first phase: the `[[source]]` weights, `[recipe] lanes`, and the job's
    seq_len and global batch size (zephon/recipe/phases.py resolves the schedule).

    weights: (source name, weight) pairs; a declared source left out is paused.
    """

    name: str
    start_step: int
    weights: tuple[tuple[str, float], ...] | None = None
    global_batch_size: int | None = None
    seq_len: int | None = None
    lanes: int | None = None


@dataclass(frozen=True)
class Recipe:
    path: str
    name: str
    seed: int
    lanes: int
    sources: tuple[SourceSpec, ...]
    mixture: MixtureSpec = field(default_factory=MixtureSpec)
    shuffle: ShuffleSpec = field(default_factory=ShuffleSpec)
    packing: PackingSpec = field(default_factory=PackingSpec)
    execution: ExecutionSpec = field(default_factory=ExecutionSpec)
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)
    image: ImageSpec = field(default_factory=ImageSpec)
    bad_records: str = "error"
    """What an unreadable record does: stop the run, or become an empty document.
    A policy, not data identity: kept out of the digest so it may change on resume."""
    phases: tuple[PhaseSpec, ...] = ()
    """The `[[phase]]` tables in step order; empty: the recipe is one phase."""

    def data_identity(
        self,
        lanes: int | None = None,
        weights: dict[str, float] | None = None,
        paths: bool = False,
    ) -> dict[str, Any]:
        """Everything in the recipe that decides the data (execution knobs excluded),
        by the field rule of `identity_of`. `lanes` and `weights` give one phase's
        identity (zephon/recipe/phases.py): only its active sources, with its weights, so a
        first phase equal to a recipe without phases has that recipe's identity.

        Where the files are is not part of it: their content is, as each file's
        size and sampled blocks (zephon/sources/content.py), which the checkpoint
        records beside this digest, so the same data reached by another path (a
        copied recipe, a moved corpus, a bucket mirrored to disk) is the same
        data (docs/design.md §11). `paths` gives the identity that loader states
        of version 2 and older recorded instead: the source paths, relative to
        the recipe folder (URLs as they are).
        """
        base = os.path.dirname(self.path)
        sources = []
        for s in self.sources:
            if weights is not None:
                if not weights.get(s.name):
                    continue  # paused in this phase: not part of its data
                s = replace(s, weight=weights[s.name])
            d = identity_of(s)
            if paths:
                d["paths"] = [p if _is_url(p) else os.path.relpath(p, base) for p in s.paths]
            else:
                del d["paths"]
            sources.append(d)
        identity = {
            "seed": self.seed,
            "lanes": self.lanes if lanes is None else lanes,
            "mixture": identity_of(self.mixture),
            "shuffle": identity_of(self.shuffle),
            "packing": identity_of(self.packing),
            "sources": sources,
        }
        if self.tokenizer.non_default():  # absent when unset: old digests stay valid
            identity["tokenizer"] = self.tokenizer.non_default()
        if identity_of(self.image):  # likewise
            identity["image"] = identity_of(self.image)
        return identity

    def digest(self, paths: bool = False) -> str:
        """The recipe's identity; with phases, their tables too (each phase's own
        identity, which a checkpoint records, is zephon/recipe/phases.py's). `paths`: the
        digest over source paths relative to the recipe folder that loader states
        of version 2 and older (and the hf baseline's states) record."""
        identity = self.data_identity(paths=paths)
        if self.phases:  # absent without phases: old digests stay valid
            identity["phases"] = [asdict(p) for p in self.phases]
        blob = json.dumps(identity, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


# -- strict TOML reading ------------------------------------------------------


class _Table:
    """A TOML table being consumed key by key; leftovers are unknown keys."""

    def __init__(self, file: str, where: str, data: Any, spec: type | None = None):
        """`spec`: the dataclass the table fills; a key it has a default for is
        optional with that default (defaults are written once, in the dataclass)."""
        if not isinstance(data, dict):
            raise RecipeError(f"{file}: [{where}] must be a table, got {type(data).__name__}")
        self.file, self.where, self.data = file, where, dict(data)
        self.defaults = (
            {f.name: _default(f) for f in fields(spec) if _default(f) is not MISSING}
            if spec
            else {}
        )
        self.known: list[str] = []  # every key asked for, to list in finish()

    def _err(self, key: str, msg: str) -> RecipeError:
        return RecipeError(f"{self.file}: {self.where}.{key}: {msg}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        self.known.append(key)
        if default is ...:
            default = self.defaults.get(key, ...)
        if key not in self.data:
            if default is ...:
                raise self._err(key, "is required")
            return default
        value = self.data.pop(key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # TOML booleans are ints in Python; never accept one for the other.
        if isinstance(value, bool) and bool not in kinds:
            ok = False
        elif float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        else:
            ok = isinstance(value, kinds)
        if not ok:
            names = " or ".join(k.__name__ for k in kinds)
            raise self._err(key, f"expected {names}, got {value!r} ({type(value).__name__})")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            raise self._err(key, f"expected one of {', '.join(choices)}; got {value!r}")
        return value

    def positive_int(self, key: str, default: Any = ..., minimum: int = 1) -> int:
        value = self.get(key, int, default)
        if value < minimum:
            raise self._err(key, f"expected an integer >= {minimum}, got {value}")
        return value

    def finish(self) -> None:
        if self.data:
            unknown = ", ".join(sorted(self.data))
            known = ", ".join(sorted(set(self.known)))
            raise RecipeError(
                f"{self.file}: [{self.where}] has unknown key(s): {unknown}; expected only: {known}"
            )


def _is_url(path: str) -> bool:
    """A remote URL (`s3://...`, read through fsspec); `file://` counts as local."""
    return "://" in path and not path.startswith("file://")


def _resolve_paths(
    file: str, where: str, raw: str | list[str], fmt: str, storage: dict[str, Any]
) -> tuple[str, ...]:
    base = os.path.dirname(os.path.abspath(file))
    patterns = [raw] if isinstance(raw, str) else raw
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise RecipeError(f"{file}: {where}.path: expected a path or a list of paths")
    found: list[str] = []
    folders = fmt != "auto" and _formats().get_format(fmt).folders
    for pattern in patterns:
        if _is_url(pattern):
            from zephon.sources.remote import glob as remote_glob

            try:
                urls = remote_glob(pattern, storage)
            except ZephonError as exc:
                raise RecipeError(f"{file}: {where}.path: {exc}") from None
            if not urls:
                raise RecipeError(f"{file}: {where}.path: {pattern!r} matches nothing")
            found.extend(urls)
            continue
        if pattern.startswith("file://"):
            pattern = pattern[len("file://") :]
        full = os.path.normpath(os.path.join(base, os.path.expanduser(pattern)))
        matches = sorted(glob.glob(full)) if glob.has_magic(full) else [full]
        matches = [m for m in matches if os.path.exists(m)]
        if not matches:
            raise RecipeError(
                f"{file}: {where}.path: {pattern!r} matches nothing "
                f"(resolved against the recipe folder to {full})"
            )
        for m in matches:
            if not folders and os.path.isdir(m):
                raise RecipeError(
                    f"{file}: {where}.path: {m} is a folder; format {fmt!r} expects files "
                    "(use a glob such as 'folder/*.jsonl')"
                )
            found.append(m)
    if len(set(found)) != len(found):
        raise RecipeError(f"{file}: {where}.path: the patterns match some files twice")
    return tuple(found)


def _formats() -> Any:
    """The registry of source formats. Imported when a recipe is read, not with this
    module: the format modules import this one (SourceSpec)."""
    from zephon.sources import formats

    return formats


def _guess_format(file: str, where: str, paths: tuple[str, ...]) -> str:
    first = paths[0]
    registry = _formats()
    fmt = registry.guess_format(first)
    if fmt is None:
        raise RecipeError(
            f"{file}: {where}.format: cannot guess the format of {first}; "
            f"set format = one of {', '.join(registry.format_names())}"
        )
    return fmt


def _parse_source(
    file: str, index: int, raw: Any, default_exhaust: str, storage_defaults: dict[str, Any]
) -> SourceSpec:
    t = _Table(file, f"source[{index}]", raw, SourceSpec)
    name = t.get("name", str)
    if not name:
        raise RecipeError(f"{file}: source[{index}].name: must not be empty")
    t.where = f"source '{name}'"
    fmt = t.get("format", str, "auto")
    known = _formats().format_names()
    if fmt != "auto" and fmt not in known:
        raise RecipeError(
            f"{file}: {t.where}.format: expected one of auto, {', '.join(known)}; got {fmt!r}"
        )
    storage = dict(storage_defaults)
    storage.update(t.get("storage_options", dict, {}))
    paths = _resolve_paths(file, t.where, t.get("path", (str, list)), fmt, storage)
    if fmt == "auto":
        fmt = _guess_format(file, t.where, paths)
    text_field = t.get("text_field", str)
    token_field = t.get("token_field", str)
    weight = t.get("weight", float)
    if not math.isfinite(weight) or weight <= 0:
        raise RecipeError(f"{file}: {t.where}.weight: expected a positive number, got {weight}")
    on_exhausted = t.choice("on_exhausted", EXHAUSTION, default_exhaust)
    hf_builder = t.choice("hf_builder", HF_BUILDERS)
    image_field = t.get("image_field", str)
    texts_field = t.get("texts_field", str)
    images_field = t.get("images_field", str)
    _check_image_fields(file, t.where, fmt, token_field, image_field, texts_field, images_field)
    t.finish()
    return SourceSpec(
        name=name,
        paths=paths,
        format=fmt,
        text_field=text_field,
        token_field=token_field,
        weight=weight,
        on_exhausted=on_exhausted,
        hf_builder=hf_builder,
        storage=json.dumps(storage, sort_keys=True) if storage else "",
        image_field=image_field,
        texts_field=texts_field,
        images_field=images_field,
    )


def _check_image_fields(
    file: str, where: str, fmt: str, token_field: str, image: str, texts: str, images: str
) -> None:
    """The image fields of a source fit its format and each other."""

    def err(key: str, msg: str) -> RecipeError:
        return RecipeError(f"{file}: {where}.{key}: {msg}")

    given = [
        k
        for k, v in (("image_field", image), ("texts_field", texts), ("images_field", images))
        if v
    ]
    image_formats = [f.name for f in _formats().registered_formats() if f.images]
    if given and fmt not in image_formats:
        raise err(
            given[0],
            f"format {fmt!r} holds text only; image fields need format {', '.join(image_formats)}",
        )
    if token_field and (given or fmt == "webdataset"):
        raise err("token_field", "pretokenized ids cannot be combined with images")
    if fmt == "webdataset":
        if texts or images:
            raise err(
                given[-1], "a WebDataset sample holds one image and one text; use image_field"
            )
        if image and image not in WDS_IMAGE_EXTS:
            raise err(
                "image_field",
                f"expected the image member's extension, one of {', '.join(WDS_IMAGE_EXTS)}; "
                f"got {image!r}",
            )
    if bool(texts) != bool(images):
        raise err(
            given[0], "interleaved documents need both texts_field and images_field (list columns)"
        )
    if image and images:
        raise err(
            "image_field",
            "image_field (one image per record) and images_field (interleaved documents) "
            "exclude each other",
        )


def _parse_storage(file: str, raw: Any) -> dict[str, Any]:
    """[storage]: fsspec options for remote paths (endpoint_url, cache_limit_gb, anything
    the protocol's file system accepts under [storage.options])."""
    t = _Table(file, "storage", raw)
    out: dict[str, Any] = dict(t.get("options", dict, {}))
    endpoint = t.get("endpoint_url", str, "")
    if endpoint:
        out["endpoint_url"] = endpoint
    limit = t.get("cache_limit_gb", float, 0.0)
    if limit < 0 or not math.isfinite(limit):
        raise RecipeError(f"{file}: storage.cache_limit_gb: expected a number >= 0, got {limit}")
    if limit:
        out["cache_limit_gb"] = limit
    t.finish()
    return out


def _parse_image(file: str, raw: Any) -> ImageSpec:
    """[image]: pixel settings; the background as [R, G, B] or "#rrggbb"."""
    t = _Table(file, "image", raw, ImageSpec)
    values = {
        k: t.get(k, int)
        for k in ("patch_size", "merge", "min_pixels", "max_pixels", "max_decoded_pixels")
    }
    tokens = {k: t.get(k, str) for k in ("start_token", "pad_token", "end_token")}
    bg = t.get("background", (list, str))
    if isinstance(bg, str):
        hex_digits = bg[1:] if bg.startswith("#") else ""
        if len(hex_digits) != 6 or any(c not in "0123456789abcdefABCDEF" for c in hex_digits):
            raise RecipeError(
                f'{file}: image.background: expected "#rrggbb" or [R, G, B], got {bg!r}'
            )
        bg = [int(hex_digits[i : i + 2], 16) for i in (0, 2, 4)]
    t.finish()
    try:
        return ImageSpec(**values, **tokens, background=tuple(bg))
    except ValueError as exc:
        raise RecipeError(f"{file}: image.{exc}") from None


def _optional_positive(t: _Table, key: str) -> int | None:
    value = t.get(key, int, None)
    if value is not None and value < 1:
        raise t._err(key, f"expected an integer >= 1, got {value}")
    return value


def _parse_weights(t: _Table, names: list[str]) -> tuple[tuple[str, float], ...] | None:
    raw = t.get("weights", dict, None)
    if raw is None:
        return None
    out = []
    for key, value in raw.items():
        if key not in names:
            raise t._err("weights", f"unknown source {key!r}; declared sources: {', '.join(names)}")
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0:
            raise t._err("weights", f"{key}: expected a number >= 0, got {value!r}")
        out.append((key, float(value)))
    if not any(w > 0 for _, w in out):
        raise t._err("weights", "no source has a positive weight; at least one must")
    # Declaration order, so that equal tables give equal phases.
    return tuple(sorted(out, key=lambda kv: names.index(kv[0])))


def _parse_phases(
    file: str, raw: list[Any], names: list[str], lanes: int, lanes_set: bool
) -> tuple[tuple[PhaseSpec, ...], int]:
    """The [[phase]] tables, checked; and the lane count of the first phase."""
    phases: list[PhaseSpec] = []
    for i, item in enumerate(raw):
        t = _Table(file, f"phase[{i}]", item)
        name = t.get("name", str)
        if not name:
            raise RecipeError(f"{file}: phase[{i}].name: must not be empty")
        t.where = f"phase '{name}'"
        start = t.get("start_step", int)
        if start < 0:
            raise t._err("start_step", f"expected an integer >= 0, got {start}")
        if phases and start <= phases[-1].start_step:
            raise t._err(
                "start_step",
                f"{start} is not after phase '{phases[-1].name}' (start_step "
                f"{phases[-1].start_step}); list phases in step order",
            )
        if not phases and start != 0:
            raise t._err("start_step", f"the first phase must start at step 0, got {start}")
        phases.append(
            PhaseSpec(
                name=name,
                start_step=start,
                weights=_parse_weights(t, names),
                global_batch_size=_optional_positive(t, "global_batch_size"),
                seq_len=_optional_positive(t, "seq_len"),
                lanes=_optional_positive(t, "lanes"),
            )
        )
        t.finish()
    seen = [p.name for p in phases]
    dupes = sorted({n for n in seen if seen.count(n) > 1})
    if dupes:
        raise RecipeError(f"{file}: duplicate phase name(s): {', '.join(dupes)}")
    first = phases[0].lanes if phases else None
    if first is not None and lanes_set and first != lanes:
        raise RecipeError(
            f"{file}: phase '{phases[0].name}'.lanes = {first} disagrees with [recipe] "
            f"lanes = {lanes}; set the first phase's lane count in one place"
        )
    return tuple(phases), first or lanes


def parse_recipe(data: dict[str, Any], file: str) -> Recipe:
    top = _Table(file, "recipe file", data)
    head = _Table(file, "recipe", top.get("recipe", dict, {}))
    name = head.get("name", str, Path(file).stem)
    seed = head.get("seed", int, 0)
    lanes_set = "lanes" in head.data
    lanes = head.positive_int("lanes", 8)
    bad_records = head.choice("bad_records", BAD_RECORDS, "error")
    head.finish()

    m = _Table(file, "mixture", top.get("mixture", dict, {}), MixtureSpec)
    mixture = MixtureSpec(
        unit=m.choice("unit", MIX_UNITS),
        on_exhausted=m.choice("on_exhausted", EXHAUSTION),
    )
    m.finish()

    s = _Table(file, "shuffle", top.get("shuffle", dict, {}), ShuffleSpec)
    shuffle = ShuffleSpec(enabled=s.get("enabled", bool), block_size=s.positive_int("block_size"))
    s.finish()

    p = _Table(file, "packing", top.get("packing", dict, {}), PackingSpec)
    packing = PackingSpec(
        algorithm=p.choice("algorithm", PACKERS),
        open_bins=p.positive_int("open_bins"),
        flush_interval=p.positive_int("flush_interval"),
    )
    p.finish()

    e = _Table(file, "execution", top.get("execution", dict, {}), ExecutionSpec)
    cache_dir = e.get("cache_dir", str)
    if cache_dir:  # relative to the recipe folder, like source paths
        base = os.path.dirname(os.path.abspath(file))
        cache_dir = os.path.normpath(os.path.join(base, os.path.expanduser(cache_dir)))
    if "block_prefetch" in e.data:
        e.positive_int("block_prefetch", 4)  # still type-checked, then ignored
        warnings.warn(
            f"{file}: execution.block_prefetch is deprecated and ignored: lookahead is now "
            "one token budget per rank, [execution] lookahead_tokens",
            DeprecationWarning,
            stacklevel=2,
        )
    execution = ExecutionSpec(
        workers=e.positive_int("workers", minimum=0),
        prefetch=e.positive_int("prefetch", minimum=0),
        lookahead_tokens=e.positive_int("lookahead_tokens", minimum=0),
        lookahead_bytes=e.positive_int("lookahead_bytes", minimum=0),
        cache_dir=cache_dir,
    )
    e.finish()

    k = _Table(file, "tokenizer", top.get("tokenizer", dict, {}), TokenizerSpec)
    tokenizer = TokenizerSpec(
        eos=k.get("eos", str),
        bos=k.get("bos", str),
        pad=k.get("pad", str),
        add_bos=k.get("add_bos", bool),
    )
    k.finish()

    image = _parse_image(file, top.get("image", dict, {}))
    storage = _parse_storage(file, top.get("storage", dict, {}))
    raw_sources = top.get("source", list, [])
    if not raw_sources:
        raise RecipeError(f"{file}: no [[source]] tables: a recipe needs at least one source")
    sources = tuple(
        _parse_source(file, i, raw, mixture.on_exhausted, storage)
        for i, raw in enumerate(raw_sources)
    )
    names = [src.name for src in sources]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecipeError(
            f"{file}: duplicate source name(s): {', '.join(dupes)}; "
            "every [[source]] needs a unique name"
        )
    phases, lanes = _parse_phases(file, top.get("phase", list, []), names, lanes, lanes_set)
    top.finish()
    return Recipe(
        path=os.path.abspath(file),
        name=name,
        seed=seed,
        lanes=lanes,
        sources=sources,
        mixture=mixture,
        shuffle=shuffle,
        packing=packing,
        execution=execution,
        tokenizer=tokenizer,
        image=image,
        bad_records=bad_records,
        phases=phases,
    )


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Read and validate a recipe file; raises RecipeError naming file and key."""
    file = os.fspath(path)
    try:
        with open(file, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise RecipeError(f"{file}: recipe file not found") from None
    except OSError as exc:  # a folder, no permission...
        raise RecipeError(f"{file}: cannot read the recipe file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{file}: not valid TOML: not UTF-8 ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{file}: not valid TOML: {exc}") from None
    return parse_recipe(data, file)
