"""Golden digests of recipe phases: the bytes of the batches through a batch-size
ramp, a seq_len change, new weights with a paused source, and lane-count changes
up and down (4 -> 6 -> 4 lanes, with `concat` and with `best_fit`) never change.

The other phase tests are relational (D = 1 equals D = 3, a resume equals the
original), so a result that is wrong the same way in every run passes them.
`tests/golden/phase_digests.json` holds the global batch digests of each case
at one rank, written once by the code of issue 27 over a corpus generated here
from fixed seeds. Each test runs its case at 2 ranks with workers and prefetch,
and resumes a state saved mid-run on 3 ranks, so it pins the bytes and the
cross-D path at once.

Regenerate only for a deliberate, documented format change:
    PYTHONPATH=tests python tests/unit/zephon/test_phases_golden.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import GOLDEN as GOLDEN_DIR
from helpers.corpus import COMMITTED_TOKENIZER, synthetic_docs, write_jsonl
from helpers.loader import close, make_ranks, save, step_digests

GOLDEN = GOLDEN_DIR / "phase_digests.json"
SOURCES = (("prose", 160, 0.5), ("code", 90, 0.3), ("math", 60, 0.2))

# name -> lanes, packing, mixture, phases, steps, the step the resumed state is saved at
CASES: dict[str, dict[str, Any]] = {
    # 4 -> 8 -> 16 rows a step: lanes give 1, 2 then 4 rows, one lane stream
    "ramp_best_fit": {
        "lanes": 4,
        "algorithm": "best_fit",
        "phases": (
            ("small", 0, "global_batch_size = 4"),
            ("double", 2, "global_batch_size = 8"),
            ("large", 4, "global_batch_size = 16"),
        ),
        "steps": 6,
        "state_step": 3,
    },
    # rows of 33 tokens, then 49: concat carries the documents cut at the boundary
    "seq_len_concat": {
        "lanes": 4,
        "algorithm": "concat",
        "phases": (("short", 0, "global_batch_size = 8"), ("long", 3, "seq_len = 48")),
        "steps": 6,
        "state_step": 4,
    },
    # math paused, then prose paused (its cursor kept), then all three again;
    # documents as the mixing unit
    "weights_paused": {
        "lanes": 4,
        "algorithm": "concat",
        "mixture": '[mixture]\nunit = "documents"\n',
        "phases": (
            ("a", 0, "global_batch_size = 8\nweights = { prose = 1, code = 1 }"),
            ("b", 2, "weights = { code = 1, math = 2 }"),
            ("c", 4, "weights = { prose = 1, code = 1, math = 1 }"),
        ),
        "steps": 6,
        "state_step": 3,
    },
    # 4 -> 6 -> 4 lanes (12 rows a step): up and down, chained (the second change
    # deals from the lists the first made); the state is saved inside the 6 lanes
    "lanes_concat": {
        "lanes": 4,
        "algorithm": "concat",
        "phases": (
            ("four", 0, "global_batch_size = 12"),
            ("six", 2, "lanes = 6"),
            ("back", 4, "lanes = 4"),
        ),
        "steps": 6,
        "state_step": 3,
    },
}
CASES["lanes_best_fit"] = {**CASES["lanes_concat"], "algorithm": "best_fit"}


def build_case(root: Path, name: str) -> Path:
    """Write the corpus and recipe of one case under root/name."""
    case = CASES[name]
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    parts = [
        f'[recipe]\nname = "{name}"\nseed = 2727\nlanes = {case["lanes"]}\n',
        "[shuffle]\nblock_size = 8\n",
        f'[packing]\nalgorithm = "{case["algorithm"]}"\nopen_bins = 3\nflush_interval = 3\n',
        case.get("mixture", ""),
        f'[execution]\ncache_dir = "{folder / "cache"}"\n',
    ]
    for k, (src, n, weight) in enumerate(SOURCES):
        write_jsonl(folder / f"{src}.jsonl", synthetic_docs(n, seed=900 + k))
        parts.append(f'[[source]]\nname = "{src}"\npath = "{src}.jsonl"\nweight = {weight}\n')
    for phase, start, body in case["phases"]:
        parts.append(f'[[phase]]\nname = "{phase}"\nstart_step = {start}\n{body}\n')
    recipe = folder / "recipe.toml"
    recipe.write_text("\n".join(parts))
    return recipe


def run_case(recipe: Path, name: str, dp: int, **kw: Any) -> tuple[list[str], dict[str, Any]]:
    """Digests of the case's steps on `dp` ranks, and the state saved after its
    state_step of them."""
    case = CASES[name]
    loaders = make_ranks(recipe, str(COMMITTED_TOKENIZER), dp, **kw)
    first = step_digests(loaders, case["state_step"])
    state = json.loads(json.dumps(save(loaders)))
    rest = step_digests(loaders, case["steps"] - case["state_step"])
    close(loaders)
    return first + rest, state


@pytest.mark.parametrize("name", sorted(CASES))
def test_phase_digests_pinned_at_two_ranks_and_resumed_at_three(tmp_path, name):
    """Case `name`: its digests at 2 ranks (workers, prefetch), and from its
    mid-run state on 3 ranks, are the committed ones."""
    expected = json.loads(GOLDEN.read_text())[name]
    assert len(expected) == CASES[name]["steps"] and len(set(expected)) == len(expected)
    recipe = build_case(tmp_path, name)
    got, state = run_case(recipe, name, 2, num_workers=2, prefetch=1)
    assert got == expected
    at = CASES[name]["state_step"]
    resumed = make_ranks(recipe, str(COMMITTED_TOKENIZER), 3)
    for loader in resumed:
        loader.load_state_dict(state)
    assert step_digests(resumed, len(expected) - at) == expected[at:]
    close(resumed)


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in sorted(CASES):
            recipe = build_case(Path(tmp), case)
            out[case], _ = run_case(recipe, case, 1, num_workers=0, prefetch=0)
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
