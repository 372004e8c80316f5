"""The golden-digest cases: fixed recipes over a small corpus generated from fixed
seeds, whose digests and loader states are committed in tests/golden/ (written by
tests/unit/zephon/test_digests_golden.py --write; other tests resume from them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from helpers.corpus import COMMITTED_TOKENIZER, synthetic_docs, write_jsonl
from helpers.loader import close, make_ranks, save, step_digests

STEPS = 24
STATE_STEP = 5

# name -> (recipe body after [recipe], sources: (name, n_docs, weight, kind))
CASES: dict[str, dict[str, Any]] = {
    "concat_tokens_repeat": {
        "body": "",
        "sources": [("prose", 300, 0.7, "jsonl"), ("code", 200, 0.3, "jsonl")],
    },
    "best_fit": {
        "body": '[packing]\nalgorithm = "best_fit"\nopen_bins = 4\nflush_interval = 8\n',
        "sources": [("prose", 300, 0.7, "jsonl"), ("code", 200, 0.3, "parquet")],
    },
    "documents_stop": {
        "body": '[mixture]\nunit = "documents"\non_exhausted = "stop"\n',
        "sources": [("prose", 400, 2.0, "jsonl"), ("code", 300, 1.0, "gz")],
    },
    "no_shuffle_small_blocks": {
        "body": "[shuffle]\nenabled = false\nblock_size = 5\n",
        "sources": [("prose", 61, 1.0, "jsonl")],
    },
    "pretokenized_and_text": {
        "body": "[packing]\nflush_interval = 3\n",
        "sources": [("ids", 150, 1.0, "ids"), ("prose", 150, 1.0, "jsonl")],
    },
}
COMMON = "[packing]\nflush_interval = 8\n"


def build_case(root: Path, name: str) -> Path:
    """Write the corpus and recipe of one golden case under root/name."""
    from tokenizers import Tokenizer

    case = CASES[name]
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    body = case["body"] or COMMON
    parts = [
        f'[recipe]\nname = "{name}"\nseed = 4242\nlanes = 8\n',
        "[shuffle]\nblock_size = 16\n" if "[shuffle]" not in body else "",
        body,
    ]
    tok = Tokenizer.from_file(str(COMMITTED_TOKENIZER))
    for k, (src, n, weight, kind) in enumerate(case["sources"]):
        docs = synthetic_docs(n, seed=500 + k)
        if kind == "jsonl":
            file, extra = f"{src}.jsonl", ""
            write_jsonl(folder / file, docs)
        elif kind == "gz":
            file, extra = f"{src}.jsonl.gz", ""
            write_jsonl(folder / file, docs, gz=True)
        elif kind == "parquet":
            file, extra = f"{src}.parquet", 'format = "parquet"\n'
            pq.write_table(pa.table({"text": docs}), folder / file, row_group_size=37)
        else:  # pretokenized JSONL
            file, extra = f"{src}.jsonl", 'token_field = "ids"\n'
            with open(folder / file, "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps({"ids": tok.encode(d, add_special_tokens=False).ids}) + "\n")
        parts.append(f'[[source]]\nname = "{src}"\npath = "{file}"\nweight = {weight}\n{extra}')
    parts.append(f'[execution]\ncache_dir = "{folder / "cache"}"\n')
    recipe = folder / "recipe.toml"
    recipe.write_text("\n".join(parts))
    return recipe


def run_case(recipe: Path, dp: int = 1, **kw: Any) -> tuple[list[str], dict[str, Any]]:
    """Digests of STEPS steps, and the state saved after STATE_STEP of them."""
    loaders = make_ranks(recipe, str(COMMITTED_TOKENIZER), dp, **kw)
    first = step_digests(loaders, STATE_STEP)
    state = json.loads(json.dumps(save(loaders)))
    rest = step_digests(loaders, STEPS - STATE_STEP)
    close(loaders)
    return first + rest, state
