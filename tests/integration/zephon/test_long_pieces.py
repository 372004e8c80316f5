"""Long documents are encoded in pieces only where that gives exactly the whole-document ids."""

from __future__ import annotations

import gzip
import itertools
import json
import random
from dataclasses import replace

import numpy as np
from helpers import REPO
from helpers.corpus import synthetic_docs
from tokenizers import Tokenizer, normalizers

from harness.train import ensure_sample_data
from zephon.tokenize.long_pieces import cut_points, encode_documents, piecewise_safe
from zephon.tokenize.tokenizer import encode_texts, load_tokenizer


def _sample_texts() -> list[str]:
    """Real prose and code from the sample corpus (built if missing: synthetic
    word lists have none of the whitespace and Unicode this test is about)."""
    ensure_sample_data()
    texts = []
    for folder in ("prose", "code"):  # code is stored gzipped
        files = sorted((REPO / "data" / "sample" / folder).glob("*.jsonl*"))[:2]
        assert len(files) == 2, f"data/sample/{folder}: {files}"
        for f in files:
            with (gzip.open if f.suffix == ".gz" else open)(f, "rt", encoding="utf-8") as fh:
                texts += [json.loads(line)["text"] for line in itertools.islice(fh, 60)]
    assert len(texts) == 4 * 60
    return texts


def _long_mixed_texts() -> list[str]:
    """Prose and code glued with awkward whitespace, Unicode and special-token text."""
    rng = random.Random(11)
    parts = _sample_texts()
    glue = [
        "\n",
        "\n\n",
        "  \n",
        " ",
        "\t\n  ",
        "\r\n",
        "\u00a0 ",
        "\u3000\n",
        "  ",
        "<|endoftext|>\n",
    ]
    extra = [
        "naïve café — 東京 🚀",
        "x = [1,  2,\t3]  # done",
        "''s 've   'll",
        "１２３ ٣٤ ⅷ",
        "a\u2028b",
    ]
    out = []
    for k in range(3):
        rng.shuffle(parts)
        chunks = []
        for p in parts:
            chunks.append(p)
            chunks.append(rng.choice(glue))
            if rng.random() < 0.3:
                chunks.append(rng.choice(extra))
        out.append("".join(chunks) * (k + 1))
    # A long text with no newline at all, and one made of long whitespace runs.
    out.append(" ".join(synthetic_docs(4000, seed=5)))
    out.append(("word " * 7 + "   " * 40 + "\n" * 3) * 3000)
    return out


def test_piecewise_ids_equal_whole_document_ids(tokenizer_path):
    tok = load_tokenizer(tokenizer_path)
    assert piecewise_safe(tok)
    texts = _long_mixed_texts()
    for piece in (1000, 4096):  # small pieces: many cuts in every text
        assert any(len(cut_points(t, piece)) > 20 for t in texts)
        got = encode_documents(texts + ["short text"], tok, piece_chars=piece)
        want = encode_texts(texts + ["short text"], tok)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            assert np.array_equal(g, w)


def test_cut_points_fall_after_non_space_before_space_or_newline():
    text = "ab  cd\n\nef " * 5000
    cuts = cut_points(text, 500)
    assert len(cuts) > 10 and cuts[0] == 0
    for c in cuts[1:]:
        assert text[c] in " \n" and not text[c - 1].isspace()


def test_tokenizer_with_a_normalizer_is_encoded_whole(tokenizer_path):
    base = load_tokenizer(tokenizer_path)
    tk = Tokenizer.from_str(base.tokenizer.to_str())
    tk.normalizer = normalizers.NFKC()
    tok = replace(base, tokenizer=tk, fingerprint=base.fingerprint + "-nfkc")
    assert not piecewise_safe(tok)
    text = "ﬁ " * 40_000  # NFKC changes this ligature; whole encoding is used
    got = encode_documents([text], tok, piece_chars=1000)
    assert np.array_equal(got[0], encode_texts([text], tok)[0])
