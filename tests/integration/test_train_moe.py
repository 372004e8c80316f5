"""The mixture-of-experts debug model end to end (issue 43): 2 processes with the
experts split over both (expert parallelism 2), the auxiliary-loss-free routing
bias and a router z-loss, a checkpoint at step 3 resumed on 1 process: the resumed
steps have the uninterrupted run's batches, losses and expert loads (the routing
bias and the experts came back through the checkpoint, resharded)."""

from __future__ import annotations

import pytest
from helpers import REPO
from helpers.train import STEPS, K, copy_checkpoint, ensure_sample_data, metrics, ok, torchrun

MOE = ["--job.config_file", str(REPO / "train_configs" / "moe_debugmodel.toml"),
       "--moe.balance", "bias", "--moe.bias_update_rate", "0.01",
       "--moe.z_loss_coef", "0.001"]  # fmt: skip
LOSS_RTOL = 1e-4  # as test_train_elastic.py: another process count reduces in another order


def test_moe_resumes_from_expert_parallel_on_one_process(tmp_path):
    ensure_sample_data()
    ref_dump = tmp_path / "ep2"
    proc = ok(torchrun(2, ref_dump, *MOE, "--parallelism.expert_parallel_degree", "2"))
    assert "experts over groups of 2" in proc.stdout and "8 experts, top 2" in proc.stdout
    ref = metrics(ref_dump)
    assert sorted(ref) == list(range(1, STEPS + 1))
    copy_checkpoint(ref_dump, K, tmp_path / "one")
    proc = ok(torchrun(1, tmp_path / "one", *MOE))
    assert f"resumed from step {K} on 1 data-parallel rank(s)" in proc.stdout
    got = metrics(tmp_path / "one")
    assert sorted(got) == list(range(K + 1, STEPS + 1))
    for step in range(K + 1, STEPS + 1):
        assert got[step]["digest"] == ref[step]["digest"], step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
        for key in ("expert_share_min", "expert_share_max", "expert_imbalance"):
            assert got[step][key] == pytest.approx(ref[step][key], rel=1e-6), (step, key)
