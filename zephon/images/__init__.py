"""Images for image-text training: encoded bytes in, uint8 patches out (DESIGN §14).

Pure functions, no I/O beyond bytes in and arrays out, one job per module:

- header:  what the header tells before decoding (size, EXIF orientation),
           the decompression-bomb refusal and the decode peak in bytes;
- decode:  the pixel definition, bytes -> RGB uint8 [H, W, 3];
- resize:  the size an image gets (window multiples within a pixel budget)
           and the one resample filter;
- patches: [num_patches, 3 * p * p] uint8 in merge-window order, and back;
- prepare: bytes -> patches for a worker, and the sizing (grid, placeholder
           tokens, decode peak) known from the header alone;
- canary:  the decode canary that tells whether two machines make the same pixels.

decode, resize, patches and canary form the pixel definition (images/pixels/):
changing any of them changes the bytes a model sees.

Settings come from the recipe's [image] table (zephon.schema.recipe.ImageSpec).
"""

from zephon.images.batch import ImageBatch
from zephon.images.documents import image_digest
from zephon.images.header import ImageHeader, read_header
from zephon.images.pixels.canary import canary_mismatch, decode_canary, decoder_versions
from zephon.images.pixels.decode import decode
from zephon.images.pixels.patches import (
    from_patches,
    patch_positions,
    placeholder_count,
    to_patches,
)
from zephon.images.pixels.resize import target_size
from zephon.images.prepare import ImagePatches, ImageSizing, prepare_image, size_image
from zephon.images.tokens import vocab_size_with_image_tokens

__all__ = [
    "ImageBatch",
    "ImageHeader",
    "ImagePatches",
    "ImageSizing",
    "canary_mismatch",
    "decode",
    "decode_canary",
    "decoder_versions",
    "from_patches",
    "image_digest",
    "patch_positions",
    "placeholder_count",
    "prepare_image",
    "read_header",
    "size_image",
    "target_size",
    "to_patches",
    "vocab_size_with_image_tokens",
]
