"""Encoding long documents in pieces, with exactly the ids of whole-document encoding.

Hugging Face tokenizers keep per-byte alignment data while encoding, so one
multi-megabyte document costs gigabytes and runs on a single core. A long text
is therefore cut into pieces that are encoded in the same `encode_batch` call
and joined, but only for tokenizer pipelines where a cut provably cannot
change the ids:

- no normalizer (a normalizer may look across the cut, e.g. NFC, strip);
- a ByteLevel pre-tokenizer with its GPT-2 split regex. That regex has no
  look-behind, and none of its matches contains both a non-whitespace
  character and a following whitespace character. So a position whose
  previous character is not whitespace and which is itself a space or a
  newline is always a match boundary, and matching after it starts fresh:
  the cut gives the same pre-tokens, hence the same BPE ids;
- a BPE model without dropout (deterministic per pre-token);
- added (special) tokens without lstrip/rstrip/single_word, which would look
  at the whitespace on either side of them.

Anything else is encoded whole. `tests/integration/zephon/test_long_pieces.py` compares piecewise
and whole encoding of long mixed texts for the committed tokenizer.
"""

from __future__ import annotations

import json
import re

import numpy as np

from zephon.tokenize.tokenizer import TokenizerInfo, encode_texts

PIECE_CHARS = 32_768  # texts up to twice this are encoded whole
CALL_CHARS = 1 << 20  # characters per encode_batch call when a text is cut
# A cut point: a space or newline right after a non-whitespace character.
# Python's \S excludes every Unicode White_Space character (and a few more),
# so a match here is also a boundary for the tokenizer's \s.
_CUT = re.compile(r"(?<=\S)[ \n]")


_SAFE: dict[str, bool] = {}  # by tokenizer fingerprint


def _safe(serialized: str) -> bool:
    conf = json.loads(serialized)
    pre = conf.get("pre_tokenizer") or {}
    model = conf.get("model") or {}
    added_ok = all(
        not (t.get("lstrip") or t.get("rstrip") or t.get("single_word"))
        and not any(c.isspace() for c in t.get("content", ""))
        for t in conf.get("added_tokens") or []
    )
    return (
        conf.get("normalizer") is None
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True) is True
        and model.get("type") == "BPE"
        and not model.get("dropout")
        and added_ok
    )


def piecewise_safe(tok: TokenizerInfo) -> bool:
    """Whether this tokenizer's output provably does not change when a text is cut."""
    if tok.fingerprint not in _SAFE:
        to_str = getattr(tok.tokenizer, "to_str", None)  # wrappers (tests, benchmarks) lack it
        _SAFE[tok.fingerprint] = _safe(to_str()) if to_str is not None else False
    return _SAFE[tok.fingerprint]


def cut_points(text: str, piece_chars: int = PIECE_CHARS) -> list[int]:
    """Start offsets of the pieces of `text` (always begins with 0)."""
    cuts = [0]
    if len(text) <= 2 * piece_chars:
        return cuts
    while True:
        m = _CUT.search(text, cuts[-1] + piece_chars)
        if m is None or len(text) - m.start() < piece_chars // 2:
            return cuts
        cuts.append(m.start())


def _wrap_lengths(tok: TokenizerInfo) -> tuple[int, int]:
    """(prefix, suffix) lengths that encode_texts adds around a document's ids
    (EOS, and a BOS if the tokenizer settings ask for one): learnt from a probe."""
    probe = "zephon probe"
    raw = tok.tokenizer.encode(probe, add_special_tokens=False).ids
    wrapped = encode_texts([probe], tok)[0].tolist()
    for a in range(len(wrapped) - len(raw) + 1):
        if wrapped[a : a + len(raw)] == raw:
            return a, len(wrapped) - a - len(raw)
    raise RuntimeError("encode_texts does not contain the document's ids; cannot join pieces")


def needs_pieces(texts: list[str], tok: TokenizerInfo, piece_chars: int = PIECE_CHARS) -> bool:
    """Whether `encode_documents` would cut any of these texts (else it is one
    `encode_texts` call)."""
    return any(len(t) > 2 * piece_chars for t in texts) and piecewise_safe(tok)


def encode_documents(
    texts: list[str], tok: TokenizerInfo, piece_chars: int = PIECE_CHARS
) -> list[np.ndarray]:
    """encode_texts(texts, tok), with long texts encoded in pieces where that is exact."""
    if not needs_pieces(texts, tok, piece_chars):
        return encode_texts(texts, tok)
    flat: list[str] = []
    spans: list[tuple[int, int]] = []
    for text in texts:
        cuts = cut_points(text, piece_chars)
        spans.append((len(flat), len(cuts)))
        flat.extend(text[a:b] for a, b in zip(cuts, cuts[1:] + [len(text)], strict=True))
    # Calls of at most CALL_CHARS: the tokenizer's per-token Encoding objects of a
    # whole multi-megabyte document would otherwise all be alive at once.
    encoded: list[np.ndarray] = []
    at = 0
    while at < len(flat):
        end, size = at, 0
        while end < len(flat) and (end == at or size + len(flat[end]) <= CALL_CHARS):
            size += len(flat[end])
            end += 1
        encoded += encode_texts(flat[at:end], tok)
        at = end
    pre, suf = _wrap_lengths(tok)
    out: list[np.ndarray] = []
    for at, k in spans:
        if k == 1:
            out.append(encoded[at])
            continue
        parts = encoded[at : at + k]
        pieces = [parts[0][: len(parts[0]) - suf]]
        pieces += [p[pre : len(p) - suf] for p in parts[1:-1]]
        pieces.append(parts[-1][pre:])
        out.append(np.concatenate(pieces))
    return out
