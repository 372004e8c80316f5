"""Which step folders `keep_latest_k` may prune: never a phase boundary's checkpoint
(the trainer crossing every kind of boundary is
tests/integration/test_train_phases.py)."""

from __future__ import annotations

import json

from torchtitan.components.checkpoint.boundaries import prunable_steps


def test_boundary_checkpoints_are_not_pruned_nor_counted(tmp_path):
    """Which step folders keep_latest_k may prune: not those whose loader state
    marks a phase boundary; an unreadable state is an ordinary folder."""
    docs = {1: {"step": 1}, 2: {"step": 2, "boundary_of": "main"}, 3: None, 4: {"step": 4},
            6: {"step": 6, "boundary_of": "anneal"}, 7: {"step": 7}}  # fmt: skip
    for step, doc in docs.items():
        folder = tmp_path / f"step-{step}"
        folder.mkdir()
        (folder / "dataloader.json").write_text("{torn" if doc is None else json.dumps(doc))
    known: dict[str, bool] = {}
    assert prunable_steps(str(tmp_path), sorted(docs), known) == [1, 3, 4, 7]
    (tmp_path / "step-2" / "dataloader.json").unlink()  # answers are kept per folder
    assert prunable_steps(str(tmp_path), sorted(docs), known) == [1, 3, 4, 7]
