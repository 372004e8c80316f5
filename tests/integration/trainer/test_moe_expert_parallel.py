"""Expert parallelism (torchtitan/models/moe/expert_parallel.py) against one process
holding every expert: four gloo ranks route their own tokens, the experts split over
groups of 2 (two ranks gather each group's expert weights) and of 4; every rank's
outputs and input gradients, the summed router gradient and each rank's stored
share of the experts' gradients equal those of the whole batch through one MoE
layer in one process."""

from __future__ import annotations

import datetime
import json
import multiprocessing
from pathlib import Path

import torch
from helpers.spawned import leave_process_group

WORLD, TOKENS, DIM = 4, 24, 16


def _layer(seed: int):
    from torchtitan.models.moe.args import MoEArgs
    from torchtitan.models.moe.model import MoE

    args = MoEArgs(dim=DIM, n_heads=2, n_experts=8, top_k=2, expert_hidden_dim=8,
                   n_shared_experts=1)  # fmt: skip
    torch.manual_seed(seed)
    moe = MoE(args)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return moe


def _rank_main(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from torchtitan.models.moe.expert_parallel import ExpertGroups

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))  # fmt: skip
    result: dict = {}
    try:
        torch.manual_seed(1)
        x_all = torch.randn(WORLD, TOKENS, DIM)
        g_all = torch.randn(WORLD, TOKENS, DIM)
        # The reference: one layer, every expert, every rank's tokens.
        ref = _layer(0)
        x_ref = x_all.clone().requires_grad_()
        out_ref = ref(x_ref)
        (out_ref * g_all).sum().backward()
        for ep in (2, 4):
            layer = _layer(0)
            groups = ExpertGroups.make(ep, WORLD)
            per = layer.n_experts // WORLD  # this rank stores experts [rank per, ...)
            for name in ("w1", "w2", "w3"):
                full = getattr(layer.experts, name)
                shard = torch.nn.Parameter(full.detach()[rank * per : (rank + 1) * per].clone())
                setattr(layer.experts, name, shard)
            layer.call_experts = groups
            x = x_all[rank].clone().requires_grad_()
            out = layer(x.unsqueeze(0)).squeeze(0)
            (out * g_all[rank]).sum().backward()
            router = layer.router.weight.grad.clone()
            dist.all_reduce(router)
            stored = {n: getattr(layer.experts, n).grad for n in ("w1", "w2", "w3")}
            ref_stored = {
                n: getattr(ref.experts, n).grad[rank * per : (rank + 1) * per]
                for n in ("w1", "w2", "w3")
            }
            result[str(ep)] = {
                "out": (out - out_ref[rank]).abs().max().item(),
                "x_grad": (x.grad - x_ref.grad[rank]).abs().max().item(),
                "router_grad": (router - ref.router.weight.grad).abs().max().item(),
                "expert_grads": max((stored[n] - ref_stored[n]).abs().max().item() for n in stored),
                "scale": out_ref.abs().max().item(),
            }
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        leave_process_group()


def test_expert_parallel_dispatch_equals_one_process(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, str(tmp_path / "pg"), str(tmp_path)))
             for r in range(WORLD)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in procs] == [0] * WORLD
    for r in range(WORLD):
        result = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert sorted(result) == ["2", "4"]
        for ep, d in result.items():
            assert d["scale"] > 0.1, d
            for key in ("out", "x_grad", "router_grad", "expert_grads"):
                assert d[key] < 1e-5, (r, ep, key, d)
