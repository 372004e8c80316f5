"""The routing balance of the mixture of experts (torchtitan/models/moe/balance.py)
does not depend on how the batch is split: the global-batch load-balance loss gives
the same router gradient for one micro-batch or four, and the auxiliary-loss-free
bias moves the same way; the per-micro-batch loss does not (which is why it makes
the model depend on the GPU count). One process, so the reduction sums nothing."""

from __future__ import annotations

import pytest
import torch

from torchtitan.config.job_config import MoEConfig
from torchtitan.models.moe.args import MoEArgs
from torchtitan.models.moe.balance import RoutingBalance
from torchtitan.models.moe.model import MoE

ROWS, SEQ, DIM = 8, 6, 16


def _layer() -> MoE:
    args = MoEArgs(dim=DIM, n_heads=2, n_experts=8, top_k=2, expert_hidden_dim=8)
    torch.manual_seed(0)
    moe = MoE(args)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return moe


def _step(balance: str, micro: int, z: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One step of the batch in `micro` micro-batches: (router gradient, bias after
    the step, load figures)."""
    moe = _layer()
    cfg = MoEConfig(balance=balance, aux_loss_coef=0.1, bias_update_rate=0.01, z_loss_coef=z)
    hooks = RoutingBalance([moe], cfg, dp=1, reduce=lambda t: None, expert_params=[])
    torch.manual_seed(1)
    x = torch.randn(ROWS, SEQ, DIM)
    valid = torch.rand(ROWS, SEQ) > 0.2  # tokens without a target do not count
    parts = list(zip(x.chunk(micro), valid.chunk(micro), strict=True))

    def count_pass() -> None:
        with torch.no_grad():
            for xm, vm in parts:
                moe(xm, vm)

    hooks.begin_step(int(valid.sum()), micro, count_pass)
    for xm, vm in parts:
        moe(xm, vm)
        extra = hooks.extra_loss()
        assert extra is not None
        extra.backward()
    figures = hooks.end_backward()
    hooks.end_step(applied=True)
    return moe.router.weight.grad.clone(), moe.expert_bias.clone(), figures


@pytest.mark.parametrize("balance", ["global_aux", "bias"])
def test_global_balance_does_not_depend_on_the_micro_batches(balance):
    z = 0.01 if balance == "bias" else 0.0  # bias alone adds no loss: the z-loss then
    one, bias_one, fig_one = _step(balance, 1, z)
    four, bias_four, fig_four = _step(balance, 4, z)
    assert one.abs().max() > 1e-4  # the loss reaches the router
    torch.testing.assert_close(one, four, rtol=1e-5, atol=1e-7)
    assert torch.equal(bias_one, bias_four)
    assert fig_one == fig_four
    if balance == "bias":
        assert bias_one.abs().max() == pytest.approx(0.01)  # every expert moved one step
    else:
        assert torch.equal(bias_one, torch.zeros_like(bias_one))


def test_the_per_micro_batch_loss_depends_on_the_micro_batches():
    one, _, _ = _step("micro_batch_aux", 1)
    four, _, _ = _step("micro_batch_aux", 4)
    assert (one - four).abs().max() > 1e-3 * one.abs().max()


def test_the_bias_moves_towards_balance():
    _, bias, figures = _step("bias", 1, z=0.01)
    moe = _layer()
    torch.manual_seed(1)
    x = torch.randn(ROWS, SEQ, DIM)
    valid = torch.rand(ROWS, SEQ) > 0.2
    chosen = moe.route(x.reshape(-1, DIM))[2][valid.reshape(-1)]
    loads = torch.bincount(chosen.reshape(-1), minlength=8).double()
    assert figures["expert_imbalance"] == pytest.approx(float(loads.max() / loads.mean()))
    above, below = loads > loads.mean(), loads < loads.mean()
    assert (bias[above] < 0).all() and (bias[below] > 0).all()
