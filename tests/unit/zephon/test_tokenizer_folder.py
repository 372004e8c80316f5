"""Hugging Face tokenizer folders, recipe `[tokenizer]` overrides and BOS per document."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from helpers.corpus import synthetic_docs
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from zephon import StateError, ZephonError, ZephonLoader, load_recipe, load_tokenizer
from zephon.tokenize.tokenizer import encode_texts

SPECIALS = ["<|bos|>", "<|eos|>", "<|padding|>"]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer folder whose special tokens have names no built-in rule knows."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(synthetic_docs(200, 3), trainer=trainer)
    folder = tmp_path_factory.mktemp("hf_tok")
    tok.save(str(folder / "tokenizer.json"))
    # transformers writes AddedToken dicts in tokenizer_config.json, strings in the map.
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"content": "<|eos|>", "special": True}, "bos_token": None})
    )
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<|bos|>", "eos_token": "<|bos|>", "pad_token": "<|padding|>"})
    )
    return folder


def _ids(folder: Path) -> dict[str, int]:
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True)
    return {t: vocab[t] for t in SPECIALS}


def test_bare_tokenizer_file_is_unchanged(tokenizer_path: str) -> None:
    tok = load_tokenizer(tokenizer_path)
    text = Tokenizer.from_file(tokenizer_path).to_str()
    assert tok.fingerprint == hashlib.sha256(text.encode()).hexdigest()
    assert (tok.eos_id, tok.add_bos, tok.choices) == (0, False, None)


def test_folder_gives_eos_bos_pad(hf_folder: Path) -> None:
    ids = _ids(hf_folder)
    tok = load_tokenizer(hf_folder)
    # tokenizer_config.json wins over special_tokens_map.json (eos); the map fills the rest.
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (
        ids["<|eos|>"],
        ids["<|bos|>"],
        ids["<|padding|>"],
    )
    assert not tok.add_bos
    assert tok.choices == {"eos": ids["<|eos|>"], "pad": ids["<|padding|>"], "bos": None}
    text = Tokenizer.from_file(str(hf_folder / "tokenizer.json")).to_str()
    assert tok.fingerprint == hashlib.sha256(text.encode()).hexdigest()


def test_no_eos_error_names_file_and_setting(hf_folder: Path) -> None:
    with pytest.raises(ZephonError) as exc:
        load_tokenizer(hf_folder / "tokenizer.json")
    msg = str(exc.value)
    assert str(hf_folder / "tokenizer.json") in msg and '[tokenizer] eos = "<token>"' in msg


def test_bad_token_in_config_names_file_and_key(hf_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</nope>"}))
    with pytest.raises(ZephonError, match=r"tokenizer_config.json: eos_token: token '</nope>'"):
        load_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": 7}))
    with pytest.raises(ZephonError, match=r"eos_token: expected a token string"):
        load_tokenizer(folder)


def test_recipe_section_overrides_and_bos_framing(hf_folder: Path, make_recipe) -> None:
    ids = _ids(hf_folder)
    path = make_recipe(extra='[tokenizer]\neos = "<|padding|>"\nadd_bos = true\n')
    recipe = load_recipe(path)
    loader = ZephonLoader(recipe, hf_folder, 128, 16, prefetch=0)
    tok = loader.tok
    assert (tok.eos_id, tok.bos_id, tok.add_bos) == (ids["<|padding|>"], ids["<|bos|>"], True)
    framed = encode_texts(["river stone", ""], tok)
    plain = tok.tokenizer.encode("river stone", add_special_tokens=False).ids
    assert framed[0].tolist() == [tok.bos_id, *plain, tok.eos_id]
    assert framed[1].tolist() == [tok.bos_id, tok.eos_id]
    # Inside packed rows every EOS that is not the row's last token is followed by BOS.
    rows = loader.next_batch().input_ids.numpy()
    after_eos = rows[:, 1:][rows[:, :-1] == tok.eos_id]
    assert len(after_eos) > 10 and np.all(after_eos == tok.bos_id)
    assert loader.fingerprint["tokenizer_choices"]["bos"] == ids["<|bos|>"]
    state = loader.state_dict()
    loader.close()

    # Turning BOS off changes the data: the resume is refused, naming the field.
    plain_recipe = make_recipe(extra='[tokenizer]\neos = "<|padding|>"\n')
    other = ZephonLoader(plain_recipe, hf_folder, 128, 16, prefetch=0)
    with pytest.raises(StateError, match="tokenizer_choices"):
        other.load_state_dict(state)
    other.close()


def test_unset_section_keeps_recipe_digest(make_recipe) -> None:
    plain = load_recipe(make_recipe()).digest()
    assert load_recipe(make_recipe(extra="[tokenizer]\n")).digest() == plain
    assert load_recipe(make_recipe(extra="[tokenizer]\nadd_bos = false\n")).digest() != plain
