"""The vision-language model on 2 processes (gloo): FSDP2 with one rank holding
images and the other none, and tensor parallelism for the decoder. Every rank
runs the vision tower on every micro-step, so the collectives pair up, and the
gradients are those of one process on the same global batch."""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp
from helpers.vlm import accumulate, distributed_worker, rank_batch, tiny_model, valid_tokens

HANG_S = 120  # far above a run's few seconds: only a hang (mismatched collectives) gets here


def _spawn(tmp_path, tp: int) -> dict[str, torch.Tensor]:
    # fork: the children start with torch imported (spawned ones re-import it, which
    # takes most of a run). They compute on one thread (distributed_worker), so no
    # OpenMP pool inherited from pytest is ever entered.
    ctx = mp.start_processes(
        distributed_worker, args=(2, str(tmp_path / "init"), str(tmp_path), tp), nprocs=2,
        join=False, start_method="fork",
    )  # fmt: skip
    deadline = time.monotonic() + HANG_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the 2-process run hung (collectives out of step between the ranks)")
    return torch.load(tmp_path / "grads.pt")


@pytest.mark.parametrize(("tp", "ranks"), [(1, [0, 1]), (2, [0])], ids=["fsdp", "fsdp_tp"])
def test_two_processes_match_one_on_the_same_global_batch(tmp_path, tp, ranks):
    """fsdp: rank 0 has images, rank 1 none (and a padded row): the vision tower's
    gradient comes from rank 0 alone, the decoder's from both. fsdp_tp: both TP
    peers of the one data-parallel rank get the images."""
    grads = _spawn(tmp_path, tp)
    model = tiny_model()
    accumulate(model, [rank_batch(r) for r in ranks], 1 / valid_tokens(len(ranks)), micro=2)
    assert set(grads) == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, rtol=1e-4, atol=1e-6), name
    assert grads["vision.layers.0.attention.wq.weight"].abs().sum() > 0
