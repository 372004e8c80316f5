"""The decode canary: does this machine make the same pixels as another?

Pixels depend on the decoder builds (Pillow, libjpeg-turbo, libwebp, zlib),
not only on the bytes and the settings. The canary decodes, resizes and cuts
into patches a few committed images (assets/images/canary/, one per decoder
path: baseline and progressive 4:2:0 JPEG, palette PNG with alpha, WebP with
alpha, an EXIF-rotated JPEG) and hashes the results. A checkpoint records the
canary with the library versions; a resume on a machine whose canary differs
is refused with `canary_mismatch`'s message, which names both machines'
versions (the refusal itself is wired where the loader fingerprint is).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ZephonError
from zephon.images.pixels.decode import decode
from zephon.images.prepare import prepare_image
from zephon.schema.recipe import ImageSpec

CANARY_DIR = Path(__file__).resolve().parents[3] / "assets" / "images" / "canary"
CANARY_FILES = (
    "baseline_420.jpg",
    "progressive_420.jpg",
    "palette_alpha.png",
    "lossy_alpha.webp",
    "exif_rotated.jpg",
)
# Bump when the images or what is hashed change: old and new canaries never compare equal.
CANARY_VERSION = 1


def decoder_versions() -> dict[str, str]:
    """Versions of the libraries that make pixels, as Pillow reports them."""
    import PIL
    from PIL import features

    def version(name: str) -> str:
        try:
            return str(features.version(name) or "absent")
        except ValueError:  # a name this Pillow does not know
            return "unknown"

    return {
        "pillow": PIL.__version__,
        "libjpeg_turbo": version("libjpeg_turbo"),
        "libjpeg": version("jpg"),
        "libwebp": version("webp"),
        "zlib": version("zlib"),
        "zlib_ng": version("zlib_ng"),
    }


def _hash_array(h: Any, a: np.ndarray) -> None:
    h.update(repr((a.dtype.str, a.shape)).encode())
    h.update(np.ascontiguousarray(a).tobytes())


def _digest(spec: ImageSpec, folder: str) -> str:
    h = hashlib.sha256(f"zephon decode canary v{CANARY_VERSION}".encode())
    for name in CANARY_FILES:
        path = Path(folder) / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ZephonError(
                f"{path}: decode canary image missing or unreadable ({exc.strerror or exc}); "
                "it is part of the repository (assets/images/canary/)"
            ) from None
        h.update(name.encode() + b"\0")
        _hash_array(h, decode(data, str(path), spec))  # the decoder alone, full resolution
        out = prepare_image(data, str(path), spec)  # resize and patch order too
        h.update(repr(out.grid).encode())
        _hash_array(h, out.patches)
    return h.hexdigest()


def decode_canary(spec: ImageSpec, folder: str | Path = CANARY_DIR) -> dict[str, Any]:
    """{"version", "digest", "decoders", "settings"}: what a checkpoint records.

    The digest is SHA-256 over every canary image's full-resolution decode and
    its patches and grid under `spec`; equal digests mean equal pixels.
    """
    return {
        "version": CANARY_VERSION,
        "digest": _digest(spec, str(folder)),
        "decoders": decoder_versions(),
        "settings": _settings(spec),
    }


def _settings(spec: ImageSpec) -> dict[str, Any]:
    """The image settings as a JSON state holds them. `decode` is left out: the
    fingerprint's own `image.decode` names a change of it (checkpoint_state.py),
    and states saved before it existed hold none."""
    settings = json.loads(json.dumps(asdict(spec)))
    del settings["decode"]
    return settings


def _versions(decoders: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(decoders.items()))


def canary_mismatch(saved: dict[str, Any], here: dict[str, Any]) -> str | None:
    """None when `here` (this machine) makes the pixels `saved` (the checkpoint's
    machine) made; otherwise the message that refuses the resume, naming both
    machines' decoder versions and those that differ."""
    if saved.get("version") == here.get("version") and saved.get("digest") == here.get("digest"):
        return None
    a, b = dict(here.get("decoders", {})), dict(saved.get("decoders", {}))
    differing = [
        f"{k} {a.get(k, '?')} here vs {b.get(k, '?')} there"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]
    if saved.get("version") != here.get("version"):
        why = (
            f"the canary itself changed (version {saved.get('version')} in the checkpoint, "
            f"{here.get('version')} here)"
        )
    elif saved.get("settings") != here.get("settings"):
        why = "the image settings differ ([image] in the recipe)"
    elif differing:
        why = "the decoder libraries differ: " + "; ".join(differing)
    else:
        why = "the decoders report the same versions but decode differently (another build)"
    return (
        f"images decode to other pixels on this machine than on the one that wrote the "
        f"checkpoint, so batches would differ: {why}. Canary {str(here.get('digest'))[:16]} "
        f"here, {str(saved.get('digest'))[:16]} in the checkpoint. This machine: "
        f"{_versions(a)}. Checkpoint's machine: {_versions(b)}."
    )
