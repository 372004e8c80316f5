"""The loader contract: both adapters implement it and resume from their own saved
document (the glue's collectives for any implementation, on a 3-process gloo group,
are tests/integration/test_loader_collectives.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from torchtitan.config.job_config import load_job_config
from torchtitan.datasets.contract import RankLoader, TrainBatch
from torchtitan.datasets.hf_adapter import HFBaselineAdapter
from torchtitan.datasets.zephon_adapter import ZephonAdapter
from zephon import StateError, load_recipe


def _adapters(make_recipe, tokenizer_path: str, tmp_path: Path) -> dict[str, Any]:
    """A factory per loader kind, on the same recipe and job config, one rank of one."""
    recipe_path = make_recipe(lanes=4)
    cfg = load_job_config(
        ["--data.recipe", str(recipe_path), "--data.tokenizer", tokenizer_path,
         "--training.seq_len", "32", "--training.global_batch_size", "8",
         "--training.local_batch_size", "2"]
    )  # fmt: skip
    recipe = load_recipe(recipe_path)
    cache = str(tmp_path / "hf_cache")
    return {
        "zephon": lambda: ZephonAdapter(cfg, recipe, 0, 1),
        "hf": lambda: HFBaselineAdapter(cfg, recipe, 0, 1, cache_dir=cache),
    }


def test_both_adapters_satisfy_the_contract_and_resume_from_their_document(
    make_recipe, tokenizer_path, tmp_path
):
    factories = _adapters(make_recipe, tokenizer_path, tmp_path)
    docs = {}
    for kind, make in factories.items():
        first = make()
        try:
            assert isinstance(first, RankLoader), kind
            assert first.source_names == ("prose", "code")
            assert first.dropped_records() is None  # the default policy drops nothing
            batches = [first.next_batch() for _ in range(2)]
            assert all(isinstance(b, TrainBatch) for b in batches)
            # Saved as JSON beside the checkpoint: the document must survive that.
            doc = json.loads(json.dumps(first.merge_states([first.state_dict()])))
            expected = first.next_batch()
        finally:
            first.close()
        second = make()
        try:
            second.check_resumable(doc)
            second.load_state(doc)
            got = second.next_batch()
        finally:
            second.close()
        assert got is not None and got.step == expected.step == 2, kind
        assert torch.equal(got.input_ids, expected.input_ids), kind
        assert torch.equal(got.positions, expected.positions), kind
        assert got.digests == expected.digests, kind
        docs[kind] = doc

    zephon, hf = factories["zephon"](), factories["hf"]()
    try:
        with pytest.raises(
            StateError, match="written by the hf loader; resume it with --data.loader hf"
        ):
            zephon.check_resumable(docs["hf"])
        with pytest.raises(StateError, match="written by the zephon loader"):
            hf.check_resumable(docs["zephon"])
    finally:
        zephon.close()
        hf.close()
