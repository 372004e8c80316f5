"""Golden digests: the bytes of a recipe's batches never change across refactors.

`tests/golden/digests.json` holds the global batch digests of fixed recipes
over a small corpus generated from fixed seeds (the cases: tests/helpers/golden.py) (not the sample corpus,
which is built from the local Python's standard library). It was written by
the code before the corpus-scale rework; every later version must reproduce
it exactly. `tests/golden/state_*.json` are loader states written by that
same code: a resume from them must continue with the golden digests (DESIGN
section 11: old checkpoints stay valid).

Regenerate only for a deliberate, documented format change:
    PYTHONPATH=tests python tests/unit/zephon/test_digests_golden.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import GOLDEN
from helpers.corpus import COMMITTED_TOKENIZER
from helpers.golden import CASES, STATE_STEP, STEPS, build_case, run_case
from helpers.loader import close, make_ranks, step_digests


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_digests_unchanged(tmp_path, name):
    expected = json.loads((GOLDEN / "digests.json").read_text())[name]
    recipe = build_case(tmp_path, name)
    got, _ = run_case(recipe, dp=2, num_workers=2, prefetch=1)
    assert got == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_committed_state_resumes_with_golden_digests(tmp_path, name):
    expected = json.loads((GOLDEN / "digests.json").read_text())[name]
    state = json.loads((GOLDEN / f"state_{name}.json").read_text())
    recipe = build_case(tmp_path, name)
    loaders = make_ranks(recipe, str(COMMITTED_TOKENIZER), 4)
    for loader in loaders:
        loader.load_state_dict(state)
    assert step_digests(loaders, STEPS - STATE_STEP) == expected[STATE_STEP:]
    close(loaders)


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in sorted(CASES):
            digests, state = run_case(build_case(Path(tmp), case), num_workers=0, prefetch=0)
            out[case] = digests
            (GOLDEN / f"state_{case}.json").write_text(
                json.dumps(state, indent=1, sort_keys=True) + "\n"
            )
    (GOLDEN / "digests.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
