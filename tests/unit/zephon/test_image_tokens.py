"""The ids of image tokens (zephon/images/tokens.py) and the `[image]` fields
that name the tokenizer's own: appended after the vocabulary by default, the
tokenizer's when named, and in the recipe digest only when named."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.corpus import write_jsonl

from zephon import RecipeError, load_tokenizer
from zephon.images.tokens import ImageTokenIds, image_token_ids, vocab_size_with_image_tokens
from zephon.recipe.load import load_recipe
from zephon.schema.recipe import ImageSpec, identity_of


def test_unnamed_image_tokens_are_appended_after_the_vocabulary():
    ids = image_token_ids(ImageSpec(), {}.get, 8192)
    assert ids == ImageTokenIds(start=8192, pad=8193, end=8194)
    assert vocab_size_with_image_tokens(8192) == 8195  # the model covers them
    assert identity_of(ImageSpec()) == {}  # existing recipe digests stay what they were


def test_named_image_tokens_are_the_tokenizers_own(tokenizer_path):
    tok = load_tokenizer(tokenizer_path)
    names = [t for t, _ in sorted(tok.tokenizer.get_vocab().items(), key=lambda kv: kv[1])[5:8]]
    spec = ImageSpec(start_token=names[0], pad_token=names[1], end_token=names[2])
    ids = image_token_ids(spec, tok.tokenizer.token_to_id, tok.vocab_size)
    assert ids == ImageTokenIds(5, 6, 7)
    assert identity_of(spec) == dict(start_token=names[0], pad_token=names[1], end_token=names[2])
    missing = ImageSpec(start_token=names[0], pad_token="<|image_pad|>", end_token=names[2])
    with pytest.raises(RecipeError, match=r"image\.pad_token: .* got '<\|image_pad\|>', which it"):
        image_token_ids(missing, tok.tokenizer.token_to_id, tok.vocab_size)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('start_token = "<a>"\n', "image.pad_token, end_token: expected all of start_token"),
        (
            'start_token = "<a>"\npad_token = "<a>"\nend_token = "<b>"\n',
            "image.start_token: the three image tokens must differ",
        ),
        ("pad_token = 5\n", r"image\.pad_token: expected str, got 5 \(int\)"),
    ],
)
def test_the_recipe_names_all_three_or_none(tmp_path: Path, table: str, message: str):
    write_jsonl(tmp_path / "a.jsonl", ["one document"])
    recipe = tmp_path / "r.toml"
    head = '[[source]]\nname = "a"\npath = "a.jsonl"\n\n[image]\n'
    recipe.write_text(head + 'start_token = "<a>"\npad_token = "<p>"\nend_token = "<b>"\n')
    named = load_recipe(recipe)
    assert named.image.pad_token == "<p>"
    recipe.write_text(head)
    assert load_recipe(recipe).digest() != named.digest()
    recipe.write_text(head + table)
    with pytest.raises(RecipeError, match=message):
        load_recipe(recipe)
