"""Reading and tokenizing blocks: the expensive, stateless part of the pipeline.

A block is a pure function of (source, epoch, block, skip), and each document
is tokenized on its own, so this work can run on any thread, in any grouping;
the lane consumes results in submission order.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import DataError, ZephonError
from zephon.shuffle import SourcePlan
from zephon.sources import SourceReader

EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")
PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]")


@dataclass(frozen=True)
class TokenizerInfo:
    tokenizer: Tokenizer
    eos_id: int
    pad_id: int
    vocab_size: int
    fingerprint: str  # sha256 of the serialized tokenizer


def load_tokenizer(path: str | os.PathLike[str]) -> TokenizerInfo:
    """Load a Hugging Face `tokenizer.json` and find its end-of-text and pad ids."""
    file = os.fspath(path)
    if not os.path.isfile(file):
        raise ZephonError(f"{file}: tokenizer file not found")
    try:
        tok = Tokenizer.from_file(file)
    except Exception as exc:  # the Rust side raises a plain Exception
        raise ZephonError(f"{file}: not a Hugging Face tokenizer.json: {exc}") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    eos = next((vocab[t] for t in EOS_CANDIDATES if t in vocab), None)
    if eos is None:
        raise ZephonError(f"{file}: no end-of-text token; expected one of {EOS_CANDIDATES}")
    pad = next((vocab[t] for t in PAD_CANDIDATES if t in vocab), eos)
    fingerprint = hashlib.sha256(tok.to_str().encode()).hexdigest()
    return TokenizerInfo(tok, eos, pad, tok.get_vocab_size(with_added_tokens=True), fingerprint)


@dataclass
class TokenizedBlock:
    docs: list[np.ndarray]  # int32 token ids, each ending with EOS
    doc_ids: np.ndarray  # document indices within the source, in visiting order


@dataclass
class RawBlock:
    """A block as read from disk: document values in visiting order."""

    values: list[Any]
    doc_ids: np.ndarray


def read_block(
    reader: SourceReader, plan: SourcePlan, epoch: int, block: int, skip: int = 0
) -> RawBlock:
    """Documents of `block` in their shuffled order, minus the first `skip`."""
    start, end = plan.block_range(block)
    order = plan.block_order(epoch, block)[skip:]
    if len(order) == 0:
        return RawBlock([], order)
    if skip:
        # On a resume only part of the block is needed: read just that part.
        lo, hi = int(order.min()), int(order.max()) + 1
        raw = reader.read_range(start + lo, start + hi)
        values = [raw[i - lo] for i in order]
    else:
        raw = reader.read_range(start, end)
        values = [raw[i] for i in order]
    return RawBlock(values, start + order)


def _with_eos(ids: Any, eos: int) -> np.ndarray:
    arr = np.empty(len(ids) + 1, dtype=np.int32)
    arr[:-1] = ids
    arr[-1] = eos
    return arr


def check_token_ids(raw: RawBlock, reader: SourceReader, tok: TokenizerInfo) -> TokenizedBlock:
    """A pretokenized block: validate the ids and append EOS."""
    docs = []
    for k, ids in enumerate(raw.values):
        # Check before narrowing to int32, so a huge id cannot overflow first. Arrays
        # (Parquet token lists, token-array sources) are checked without per-token Python.
        if isinstance(ids, np.ndarray):
            top = int(ids.max()) if len(ids) else 0
        else:
            top = max(ids, default=0)
        if top >= tok.vocab_size:
            raise DataError(
                f"source '{reader.spec.name}' ({', '.join(reader.spec.paths)}) document "
                f"{int(raw.doc_ids[k])}: token id {top} is outside the tokenizer's "
                f"vocabulary ({tok.vocab_size})"
            )
        docs.append(_with_eos(ids, tok.eos_id))
    return TokenizedBlock(docs, raw.doc_ids)


def encode_texts(texts: list[str], tok: TokenizerInfo) -> list[np.ndarray]:
    encodings = tok.tokenizer.encode_batch(texts, add_special_tokens=False)
    return [_with_eos(enc.ids, tok.eos_id) for enc in encodings]


def tokenize_block(
    reader: SourceReader,
    plan: SourcePlan,
    tok: TokenizerInfo,
    epoch: int,
    block: int,
    skip: int = 0,
) -> TokenizedBlock:
    """Read and tokenize one block on the calling thread (the no-worker mode)."""
    raw = read_block(reader, plan, epoch, block, skip)
    if reader.spec.pretokenized:
        return check_token_ids(raw, reader, tok)
    return TokenizedBlock(encode_texts(raw.values, tok), raw.doc_ids)
