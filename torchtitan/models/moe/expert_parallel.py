"""Expert parallelism: the routed experts split over groups of data-parallel ranks.

With `expert_parallel_degree = ep` of a data-parallel size `dp`, rank r is the
expert-parallel rank `e = r // k` (k = dp / ep) of the group {r mod k + j k}: the
ranks of one group hold different experts (rank e of a group computes experts
[e E/ep, (e+1) E/ep)) and send each other the tokens routed there (all-to-all),
each rank's own tokens coming back to it in their order.

The expert weights are stored as every other parameter is, sharded along the
expert dimension over the data-parallel ranks (`DTensor`, `Shard(0)`, rank r
holding experts [r E/dp, (r+1) E/dp)), so checkpoints and the optimizer see the
same tensors with or without expert parallelism, and a checkpoint moves between
expert-parallel degrees like any other. FSDP does not gather them: the k ranks
of one `e` (consecutive ranks) gather their shards into that rank's E/ep
experts, whose gradients go back summed over the k ranks; those sums hold every
token's contribution once for each rank it came from, so the experts' gradients
are divided by dp after backward (the others are averaged over dp by FSDP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from torchtitan.models.moe.model import GroupedExperts, MoE
from torchtitan.torch_compat import all_gather_tensor


@dataclass
class ExpertGroups:
    """This rank's expert-parallel group (all-to-all) and gather group (its shards)."""

    ep: int
    k: int
    dispatch: dist.ProcessGroup
    gather: dist.ProcessGroup | None  # None when k = 1: the shard is the experts

    @classmethod
    def make(cls, ep: int, dp: int) -> ExpertGroups:
        """Collective over the world (every rank creates every group)."""
        k = dp // ep
        dispatch = [[g + j * k for j in range(ep)] for g in range(k)]
        gather = [[e * k + g for g in range(k)] for e in range(ep)]
        mine_dispatch, _ = dist.new_subgroups_by_enumeration(dispatch)
        mine_gather = dist.new_subgroups_by_enumeration(gather)[0] if k > 1 else None
        return cls(ep, k, mine_dispatch, mine_gather)

    def weights(self, experts: GroupedExperts) -> tuple[torch.Tensor, ...]:
        """This rank's experts' weights: its shard, gathered over its k ranks
        (autograd: the gradients go back summed)."""
        out = []
        for w in (experts.w1, experts.w2, experts.w3):
            local = w.to_local() if isinstance(w, DTensor) else w
            if self.gather is not None:
                local = _Gather.apply(local, self.gather)
            out.append(local)
        return tuple(out)

    def __call__(
        self, rows: torch.Tensor, counts: torch.Tensor, experts: GroupedExperts
    ) -> torch.Tensor:
        """`rows` (this rank's routed rows, sorted by global expert, `counts` per
        expert) through their experts wherever those are; the outputs in `rows`'
        order. Collective over the dispatch group."""
        ep, n = self.ep, counts.numel() // self.ep  # n: experts a rank computes
        send = counts.view(ep, n)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send.contiguous(), group=self.dispatch)
        send_sizes, recv_sizes = send.sum(1).tolist(), recv.sum(1).tolist()
        received = _AllToAll.apply(rows, send_sizes, recv_sizes, self.dispatch)
        # Received: by source rank, then by expert; the experts want them by expert.
        by_expert = _source_major_to_expert_major(recv)
        out = GroupedExperts.compute(
            received[by_expert], recv.sum(0).tolist(), *self.weights(experts)
        )
        back = torch.empty_like(out).index_copy(0, by_expert, out)
        return _AllToAll.apply(back, recv_sizes, send_sizes, self.dispatch)


class _AllToAll(torch.autograd.Function):
    """Rows to the ranks of `group`: `send[j]` rows to rank j, `recv[j]` from it;
    backward sends the gradients back the same way."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup
    ) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty(sum(recv), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out = grad.new_empty(sum(ctx.send), *grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


class _Gather(torch.autograd.Function):
    """The shards of `group`'s ranks concatenated along dim 0; backward: each rank's
    shard of the gradient summed over the group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.rows = group, x.shape[0]
        size = dist.get_world_size(group)
        out = x.new_empty(size * x.shape[0], *x.shape[1:])
        all_gather_tensor(out, x.contiguous(), group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)  # (gloo has no reduce-scatter)
        rank = dist.get_rank(ctx.group)
        return total[rank * ctx.rows : (rank + 1) * ctx.rows], None


def _source_major_to_expert_major(recv: torch.Tensor) -> torch.Tensor:
    """The order that takes rows laid out by (source, expert) blocks of sizes
    `recv [sources, experts]` to (expert, source) blocks: row indices."""
    device = recv.device
    sizes = recv.reshape(-1)
    starts = torch.cumsum(sizes, 0) - sizes  # each (source, expert) block's first row
    blocks = starts.view(recv.shape).t().reshape(-1)  # in (expert, source) order
    lengths = recv.t().reshape(-1)
    block_of_row = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
    first = torch.cumsum(lengths, 0) - lengths
    within = torch.arange(int(lengths.sum()), device=device) - first[block_of_row]
    return blocks[block_of_row] + within


def shard_experts(
    model: nn.Module, moes: list[MoE], mesh: DeviceMesh, ep: int
) -> list[nn.Parameter]:
    """Expert parallelism on a (meta or real) model: each MoE layer's expert weights
    become this rank's `Shard(0)` of them over `mesh` (the 1-D data-parallel mesh)
    and its experts are called through the expert groups. Returns the expert
    parameters (FSDP leaves them out; their gradients are divided by dp after
    backward). Collective over the world."""
    dp = mesh.size()
    groups = ExpertGroups.make(ep, dp)
    params = []
    for moe in moes:
        for name in ("w1", "w2", "w3"):
            full = getattr(moe.experts, name)
            per_rank = full.shape[0] // dp
            local = full.detach()[mesh.get_local_rank() * per_rank :][:per_rank]
            shard = nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False))
            setattr(moe.experts, name, shard)
            params.append(shard)
        moe.call_experts = groups
    return params
