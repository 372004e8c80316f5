"""The committed tokenizer and deterministic synthetic corpora (conftest.py's fixtures
write their recipes with these)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from helpers import REPO

COMMITTED_TOKENIZER = REPO / "assets" / "tokenizer" / "tokenizer.json"
WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an which "
    "data lane batch token model train resume rank worker shard epoch seed pack row "
    "river stone cloud green quick brown fox jumps over lazy dog def return class import"
).split()


def synthetic_docs(n: int, seed: int, min_words: int = 3, max_words: int = 120) -> list[str]:
    """Documents of widely varying length, deterministic in (n, seed)."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        k = rng.choice([rng.randint(min_words, 12), rng.randint(min_words, max_words)])
        docs.append(f"doc{i} " + " ".join(rng.choice(WORDS) for _ in range(k)))
    return docs


def write_jsonl(path: Path, docs: list[str], field: str = "text", gz: bool = False) -> None:
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"id": f"{path.stem}-{i}", field: text}) + "\n")
