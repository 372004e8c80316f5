"""Shared fixtures: a small tokenizer and synthetic corpora written to tmp dirs."""

from __future__ import annotations

import locale
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.corpus import COMMITTED_TOKENIZER, synthetic_docs, write_jsonl
from hypothesis import settings


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The committed tokenizer; a tiny BPE trained here if it is missing."""
    if COMMITTED_TOKENIZER.is_file():
        return str(COMMITTED_TOKENIZER)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(synthetic_docs(500, 7), trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


RecipeFactory = Callable[..., Path]


@pytest.fixture
def make_recipe(tmp_path: Path) -> RecipeFactory:
    """Write a corpus and a recipe; returns the recipe path.

    sources: list of (name, n_docs, weight) or dicts of extra source keys.
    """

    def make(
        sources: list[tuple[str, int, float]] | None = None,
        lanes: int = 8,
        algorithm: str = "concat",
        flush_interval: int = 8,
        block_size: int = 16,
        unit: str = "tokens",
        on_exhausted: str = "repeat",
        seed: int = 1234,
        workers: int = 0,
        prefetch: int = 0,
        gz: bool = False,
        extra: str = "",
    ) -> Path:
        sources = sources or [("prose", 300, 0.7), ("code", 200, 0.3)]
        root = tmp_path / "corpus"
        root.mkdir(exist_ok=True)
        parts = [
            f'[recipe]\nname = "test"\nseed = {seed}\nlanes = {lanes}\n',
            f'[mixture]\nunit = "{unit}"\non_exhausted = "{on_exhausted}"\n',
            f"[shuffle]\nblock_size = {block_size}\n",
            f'[packing]\nalgorithm = "{algorithm}"\nopen_bins = 4\nflush_interval = {flush_interval}\n',
            f"[execution]\nworkers = {workers}\nprefetch = {prefetch}\n"
            f'cache_dir = "{tmp_path / "cache"}"\n',
        ]
        for k, (name, n, weight) in enumerate(sources):
            suffix = ".jsonl.gz" if gz else ".jsonl"
            write_jsonl(root / f"{name}{suffix}", synthetic_docs(n, seed=100 + k), gz=gz)
            parts.append(
                f'[[source]]\nname = "{name}"\npath = "{name}{suffix}"\nweight = {weight}\n'
            )
        parts.append(extra)
        path = root / "recipe.toml"
        path.write_text("\n".join(parts))
        return path

    return make


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """One moto S3 server for the session (tests/helpers/s3_server.py), with test credentials
    in the environment while it runs; each test module uses its own bucket."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from helpers.s3_server import CREDENTIALS, start_moto

    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    server = start_moto()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def ascii_locale() -> Iterator[None]:
    """LC_CTYPE "C" for the test: open() without an encoding then reads ASCII, so a
    file read that relies on the machine's locale fails on UTF-8 text."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        if sys.flags.utf8_mode or locale.getencoding().lower().replace("-", "") == "utf8":
            pytest.skip("open() reads UTF-8 whatever the locale here")
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, old)


# -- hypothesis: the property tests' profile (tests/unit/zephon/test_*_properties.py) -----
# "ci" is derandomized, so every run tries the same examples (a failure reproduces), and
# writes no example database. HYPOTHESIS_PROFILE=thorough searches wider, by hand.
settings.register_profile("ci", derandomize=True, max_examples=50, deadline=None, database=None)
settings.register_profile("thorough", max_examples=3000, deadline=None, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
