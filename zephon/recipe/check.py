"""Check: what a parsed recipe's values mean together, without touching storage.

Names are unique (sources, phases), phases run in step order from step 0, a
named format is a registered one, and a source's image fields fit its format
and each other. A source whose format is "auto" is checked again once
resolve.py has guessed its format from its files (`check_source_format`).
"""

from __future__ import annotations

from zephon.errors import RecipeError
from zephon.recipe.parse import Reader
from zephon.schema.recipe import WDS_IMAGE_EXTS, Recipe, SourceSpec
from zephon.sources import formats


def check_recipe(recipe: Recipe, reader: Reader) -> None:
    """Every check a parsed recipe can pass before its files are looked at."""
    file = reader.file
    names = [s.name for s in recipe.sources]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecipeError(
            f"{file}: duplicate source name(s): {', '.join(dupes)}; "
            "every [[source]] needs a unique name"
        )
    known = formats.format_names()
    for i, spec in enumerate(recipe.sources):
        if spec.format != "auto" and spec.format not in known:
            raise RecipeError(
                f"{reader.at(f'source[{i}]', 'format')}: source '{spec.name}'.format: expected "
                f"one of auto, {', '.join(known)}; got {spec.format!r}"
            )
        if spec.format != "auto":
            check_source_format(spec, reader.at(f"source[{i}]"))
    _check_phases(recipe, reader)


def check_source_format(spec: SourceSpec, at: str) -> None:
    """The image fields of a source fit its (known) format and each other; `at`:
    `file:line` of the source's table for the message."""
    where = f"source '{spec.name}'"

    def err(key: str, msg: str) -> RecipeError:
        return RecipeError(f"{at}: {where}.{key}: {msg}")

    image, texts, images, fmt = spec.image_field, spec.texts_field, spec.images_field, spec.format
    given = [
        k
        for k, v in (("image_field", image), ("texts_field", texts), ("images_field", images))
        if v
    ]
    image_formats = [f.name for f in formats.registered_formats() if f.images]
    if given and fmt not in image_formats:
        raise err(
            given[0],
            f"format {fmt!r} holds text only; image fields need format {', '.join(image_formats)}",
        )
    if spec.token_field and (given or fmt == "webdataset"):
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


def _check_phases(recipe: Recipe, reader: Reader) -> None:
    """Phases in step order, the first at step 0, each name once."""
    phases = recipe.phases
    for i, phase in enumerate(phases):
        at = f"{reader.at(f'phase[{i}]', 'start_step')}: phase '{phase.name}'.start_step"
        if i == 0 and phase.start_step != 0:
            raise RecipeError(f"{at}: the first phase must start at step 0, got {phase.start_step}")
        if i and phase.start_step <= phases[i - 1].start_step:
            before = phases[i - 1]
            raise RecipeError(
                f"{at}: {phase.start_step} is not after phase '{before.name}' (start_step "
                f"{before.start_step}); list phases in step order"
            )
    seen = [p.name for p in phases]
    dupes = sorted({n for n in seen if seen.count(n) > 1})
    if dupes:
        raise RecipeError(f"{reader.file}: duplicate phase name(s): {', '.join(dupes)}")
