"""Worker-side work: read one block of a source and tokenize it.

This is the expensive, stateless part of the pipeline. A block is a pure
function of (source, epoch, block, skip), so workers can run it in any order
on any thread; the lane consumes results in submission order.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

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


def tokenize_block(
    reader: SourceReader,
    plan: SourcePlan,
    tok: TokenizerInfo,
    epoch: int,
    block: int,
    skip: int = 0,
) -> TokenizedBlock:
    """Documents of `block` in their shuffled order, minus the first `skip`."""
    start, end = plan.block_range(block)
    order = plan.block_order(epoch, block)[skip:]
    if len(order) == 0:
        return TokenizedBlock([], order)
    if skip:
        # On a resume only part of the block is needed: read just that part.
        lo, hi = int(order.min()), int(order.max()) + 1
        raw = reader.read_range(start + lo, start + hi)
        values = [raw[i - lo] for i in order]
    else:
        raw = reader.read_range(start, end)
        values = [raw[i] for i in order]
    if reader.spec.pretokenized:
        docs = []
        for k, ids in enumerate(values):
            # Check before narrowing to int32, so a huge id cannot overflow first.
            top = max(ids, default=0)
            if top >= tok.vocab_size:
                raise DataError(
                    f"source '{reader.spec.name}' ({', '.join(reader.spec.paths)}) document "
                    f"{start + int(order[k])}: token id {top} is outside the tokenizer's "
                    f"vocabulary ({tok.vocab_size})"
                )
            arr = np.empty(len(ids) + 1, dtype=np.int32)
            arr[:-1] = ids
            arr[-1] = tok.eos_id
            docs.append(arr)
    else:
        encodings = tok.tokenizer.encode_batch(values, add_special_tokens=False)
        docs = []
        for enc in encodings:
            ids = enc.ids
            arr = np.empty(len(ids) + 1, dtype=np.int32)
            arr[:-1] = ids
            arr[-1] = tok.eos_id
            docs.append(arr)
    return TokenizedBlock(docs, start + order)
