"""What a data recipe says, as frozen dataclasses: its sources, mixture, shuffle,
packing, execution knobs, tokenizer overrides, image settings and phases, and
the rule by which each field enters the recipe's identity digest.

Reading a recipe file into these is zephon/recipe/ (parse, check, resolve);
this module does no I/O and imports no other stage, so every stage may use the
types (a decode process reads `ImageSpec` without loading the sources).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from zephon.schema.toml import field_default

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


def identity_of(spec: Any) -> dict[str, Any]:
    """The fields of a spec dataclass that enter the digest, by the rule above."""
    out: dict[str, Any] = {}
    for f in fields(spec):
        rule = f.metadata.get("identity", "if_set")
        if rule == "never":
            continue
        value = getattr(spec, f.name)
        if rule == "if_set" and value == field_default(f):
            continue
        out[f.name] = identity_of(value) if hasattr(value, "__dataclass_fields__") else value
    return out


@dataclass(frozen=True)
class SourceSpec:
    name: str = field(metadata=ALWAYS)
    # The files, resolved (recipe/resolve.py): absolute, each pattern's matches sorted.
    # Parsed but not yet resolved: empty, and `format` may still be "auto".
    paths: tuple[str, ...] = field(metadata=ALWAYS)
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
    # The `path` value as written (patterns, relative to the recipe folder, or URLs):
    # what resolution turns into `paths`. Where the files are is not what they are.
    patterns: tuple[str, ...] = field(default=(), metadata=NEVER)

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


# [image] decode: how JPEGs are decoded before the resize (ImageSpec.decode).
IMAGE_DECODES = ("exact", "reduced")

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
    # "exact": every JPEG decoded at its stored resolution, then resized. "reduced":
    # a JPEG larger than twice its target size a side is decoded at 1/2, 1/4 or 1/8
    # scale (libjpeg's DCT scaling), still at least the target size, then resized:
    # fewer pixels decoded, other pixels (images/pixels/decode.py, rule 1).
    decode: str = "exact"

    def __post_init__(self) -> None:
        """Bad values raise ValueError('field: what was expected, got value')."""
        if self.decode not in IMAGE_DECODES:
            raise ValueError(f"decode: expected one of {', '.join(map(repr, IMAGE_DECODES))}, "
                             f"got {self.decode!r}")  # fmt: skip
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
                d["paths"] = [p if is_url(p) else os.path.relpath(p, base) for p in s.paths]
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


def is_url(path: str) -> bool:
    """A remote URL (`s3://...`, read through fsspec); `file://` counts as local."""
    return "://" in path and not path.startswith("file://")
