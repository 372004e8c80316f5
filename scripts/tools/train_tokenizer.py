"""Train the bundled byte-level BPE tokenizer on the sample corpus.

Reads the TRAINING shards made by ``scripts/tools/build_sample_data.py`` (prose JSONL
and code gzip JSONL; the validation files are never read) and trains a
byte-level BPE model with the Hugging Face ``tokenizers`` library:

* special tokens ``<|endoftext|>`` (id 0) and ``<|pad|>`` (id 1);
* all 256 byte symbols in the base alphabet, so any text encodes without an
  unknown token;
* a ByteLevel pre-tokenizer and decoder (no prefix space), no normalizer and
  no post-processor, so ``decode(encode(text).ids) == text`` exactly.

Usage::

    python scripts/tools/train_tokenizer.py [--data data/sample] [--vocab-size 8192]
                                      [--out assets/tokenizer/tokenizer.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]  # ids 0 and 1, in this order
DEFAULT_VOCAB_SIZE = 8192
MAX_FILE_BYTES = 1_000_000  # the tokenizer file is committed; keep it small


def training_files(data: Path) -> list[Path]:
    """The training shards of the sample corpus, in a fixed order."""
    files = sorted((data / "prose").glob("part-*.jsonl")) + sorted(
        (data / "code").glob("part-*.jsonl.gz")
    )
    if not files or not (data / "MANIFEST.json").is_file():
        raise SystemExit(
            f"error: no complete sample corpus under {data}; "
            "run `python scripts/tools/build_sample_data.py` first"
        )
    return files


def iter_texts(files: list[Path]) -> Iterator[str]:
    """Yield the ``text`` of every document of the given JSONL / JSONL.gz files."""
    for path in files:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)["text"]


def build_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE tokenizer with the pipeline described above."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train(files: list[Path], vocab_size: int) -> Tokenizer:
    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(iter_texts(files), trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        got = tok.token_to_id(token)
        if got != i:
            raise RuntimeError(f"special token {token!r} got id {got}, expected {i}")
    return tok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("data/sample"), help="corpus folder")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--out", type=Path, default=Path("assets/tokenizer/tokenizer.json"))
    args = parser.parse_args(argv)

    files = training_files(args.data)
    start = time.perf_counter()
    tok = train(files, args.vocab_size)
    seconds = time.perf_counter() - start

    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tok.save(str(tmp), pretty=True)
    size = tmp.stat().st_size
    if size >= MAX_FILE_BYTES:
        tmp.unlink()
        raise SystemExit(
            f"error: tokenizer file would be {size} bytes (limit {MAX_FILE_BYTES}); "
            "use a smaller --vocab-size"
        )
    tmp.replace(args.out)
    print(
        f"trained vocab {tok.get_vocab_size()} on {len(files)} files in {seconds:.1f}s; "
        f"wrote {args.out} ({size / 1e3:.0f} kB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
