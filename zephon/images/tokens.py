"""The token ids of images: start, placeholder and end, for loader and model alike.

An image in a row is `start`, then one `pad` (placeholder) per merge window,
then `end`; the model puts the image's embeddings at the placeholders. The
committed tokenizer has no image tokens and must not change (its fingerprint
is pinned by golden loader states), so by default the three ids are appended
after the tokenizer's vocabulary and the model's vocabulary grows by three.
A recipe whose tokenizer has its own image tokens names them in `[image]`
(`start_token`, `pad_token`, `end_token`, all three or none), and their ids
are the tokenizer's. One pure function decides, so the loader that writes the
ids and the model that embeds them cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zephon.errors import RecipeError
from zephon.schema.recipe import ImageSpec

# Ids appended after the tokenizer's vocabulary when the recipe names no image tokens.
APPENDED_TOKENS = 3


@dataclass(frozen=True)
class ImageTokenIds:
    start: int
    pad: int  # the placeholder: one per merge window
    end: int


def image_token_ids(
    spec: ImageSpec, token_to_id: Callable[[str], int | None], vocab_size: int
) -> ImageTokenIds:
    """The ids of the image tokens for a tokenizer of `vocab_size` ids whose
    `token_to_id` maps a token name to its id (None when absent), e.g.
    `TokenizerInfo.tokenizer.token_to_id`.

    Names in `spec` -> the tokenizer's ids (RecipeError naming the field and the
    token when one is missing); no names -> vocab_size, vocab_size + 1, vocab_size + 2.
    """
    names = {"start": spec.start_token, "pad": spec.pad_token, "end": spec.end_token}
    if not any(names.values()):
        return ImageTokenIds(vocab_size, vocab_size + 1, vocab_size + 2)
    ids = {}
    for key, name in names.items():
        found = token_to_id(name)
        if found is None:
            raise RecipeError(
                f"image.{key}_token: expected a token of the tokenizer's vocabulary, got "
                f"{name!r}, which it does not have (leave all three unset to append image "
                "tokens after the vocabulary)"
            )
        ids[key] = found
    return ImageTokenIds(**ids)


def vocab_size_with_image_tokens(vocab_size: int) -> int:
    """The vocabulary a model needs for a tokenizer of `vocab_size` ids: room for
    the appended image tokens, whether or not the recipe names its own (so the
    model's shape does not depend on the recipe's `[image]` table)."""
    return vocab_size + APPENDED_TOKENS
