"""A mixture-of-experts decoder: Llama 3's attention, norms and embeddings, with the
feed-forward of every layer after the first `n_dense_layers` replaced by routed
experts (`MoE`).

FQNs (checkpoints): ``layers.<i>.feed_forward`` is a dense SwiGLU (``w1, w2, w3``)
in the dense layers, else ``router.weight``, ``experts.{w1, w2, w3}`` (``[experts,
in, out]``), ``shared_experts.{w1, w2, w3}`` when there are shared experts, and
the buffer ``expert_bias`` (the routing bias of the auxiliary-loss-free balance,
checkpointed with the model).

Routing is dropless: every token goes to its `top_k` experts whatever the others
do, so a token's output does not depend on the tokens it shares a batch with,
nor on how the batch is split over ranks and micro-batches. The routing bias
only chooses experts; the weights of the chosen ones come from the scores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from torchtitan.models.llama3.model import Attention, FeedForward, Mask, RMSNorm, Transformer
from torchtitan.models.moe.args import MoEArgs
from torchtitan.torch_compat import grouped_mm

# (routed rows sorted by expert, rows per expert, the experts' module) -> their outputs:
# the local computation, or expert parallelism's dispatch around it (expert_parallel.py)
ExpertsCall = Callable[[torch.Tensor, torch.Tensor, "GroupedExperts"], torch.Tensor]


class GroupedExperts(nn.Module):
    """`n` SwiGLU experts as three stacked weights, `[n, in, out]` each, computed
    group by group (one matmul per weight over every expert's rows)."""

    def __init__(self, n: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(n, hidden, dim))
        self.w3 = nn.Parameter(torch.empty(n, dim, hidden))

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w1, w2, w3) of the experts computed here (expert parallelism: this rank's)."""
        return self.w1, self.w2, self.w3

    @staticmethod
    def compute(
        x: torch.Tensor, counts: list[int], w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor
    ) -> torch.Tensor:
        """`x` rows in consecutive groups of `counts`, one per expert of the weights."""
        w1, w2, w3 = (w.to(x.dtype) for w in (w1, w2, w3))
        h = F.silu(grouped_mm(x, w1, counts)) * grouped_mm(x, w3, counts)
        return grouped_mm(h, w2, counts)


def local_experts(
    rows: torch.Tensor, counts: torch.Tensor, experts: GroupedExperts
) -> torch.Tensor:
    """Every expert here: the rows, grouped by expert, through their experts."""
    return experts.compute(rows, counts.tolist(), *experts.weights())


class MoE(nn.Module):
    """Top-k token-choice routing to `n_experts` SwiGLU experts, plus shared experts."""

    def __init__(self, args: MoEArgs) -> None:
        super().__init__()
        self.n_experts, self.top_k = args.n_experts, args.top_k
        self.score_func, self.route_norm, self.route_scale = (
            args.score_func, args.route_norm, args.route_scale,
        )  # fmt: skip
        self.router = nn.Linear(args.dim, args.n_experts, bias=False)
        self.experts = GroupedExperts(args.n_experts, args.dim, args.expert_hidden_dim)
        self.shared_experts = (
            FeedForward(args.dim, args.expert_hidden_dim * args.n_shared_experts)
            if args.n_shared_experts
            else None
        )
        self.register_buffer("expert_bias", torch.zeros(args.n_experts), persistent=True)
        self.call_experts: ExpertsCall = local_experts
        """How the routed rows reach their experts (expert_parallel.py replaces it)."""
        self.observe: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None] = (
            _ignore
        )
        """Sees (router logits, scores, chosen experts, which tokens count) of every
        forward: the routing balance (balance.py) counts the load there."""

    def route(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`x [T, dim]` -> (logits, scores [T, E] float32, chosen experts [T, k],
        their weights [T, k])."""
        logits = self.router(x).float()
        scores = logits.softmax(-1) if self.score_func == "softmax" else logits.sigmoid()
        chosen = (scores + self.expert_bias).topk(self.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if self.route_norm:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, scores, chosen, weights * self.route_scale

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """`x [B, S, dim]`; `valid [B, S]`: the tokens the balance counts (those with a
        target); every token is computed."""
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        logits, scores, chosen, weights = self.route(xt)
        counted = (
            valid.reshape(-1)
            if valid is not None
            else torch.ones_like(chosen[:, 0], dtype=torch.bool)
        )
        self.observe(logits, scores, chosen, counted)
        # Dropless dispatch: every (token, choice) pair, sorted by expert (stable, so
        # a token's pairs keep their order whatever the batch holds).
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=self.n_experts)
        out_sorted = self.call_experts(xt[token], counts, self.experts)
        scale = weights.reshape(-1)[order].unsqueeze(-1).to(out_sorted.dtype)
        out = torch.zeros_like(xt).index_add(0, token, out_sorted * scale)
        if self.shared_experts is not None:
            out = out + self.shared_experts(xt)
        return out.view(shape)


def _ignore(*_: Any) -> None:
    pass


class MoEBlock(nn.Module):
    """Attention, then a dense or mixture-of-experts feed-forward (FQN ``feed_forward``
    either way)."""

    def __init__(self, args: MoEArgs, layer: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.moe = args.is_moe_layer(layer)
        self.feed_forward: nn.Module = (
            MoE(args) if self.moe else FeedForward(args.dim, args.ffn_hidden_dim)
        )
        self.checkpoint_activations = False

    def _block(
        self, x: torch.Tensor, rope: torch.Tensor, mask: Mask, valid: torch.Tensor | None
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask)
        ffn_in = self.ffn_norm(h)
        out = self.feed_forward(ffn_in, valid) if self.moe else self.feed_forward(ffn_in)
        return h + out

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, mask: Mask, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.checkpoint_activations and torch.is_grad_enabled():
            return checkpoint(self._block, x, rope, mask, valid, use_reentrant=False)
        return self._block(x, rope, mask, valid)


class MoETransformer(Transformer):
    """Llama 3's decoder (embeddings, rotary tables, masks, final norm and output)
    with `MoEBlock` layers."""

    args: MoEArgs

    def make_block(self, args: Any, layer: int) -> nn.Module:
        return MoEBlock(args, layer)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As Llama 3's; `valid [B, S]`: the tokens the routing balance counts."""
        h = self.tok_embeddings(tokens)
        rope, mask = self.rope_and_mask(tokens.shape[1], positions)
        for layer in self.layers.values():
            h = layer(h, rope, mask, valid)
        return self.project(h)

    def residual_weights(self, whole: nn.Module) -> list[torch.Tensor]:
        """The projections into the residual stream: attention.wo and every
        feed-forward's output (dense w2, experts' w2, shared experts' w2)."""
        out = []
        for block in whole.layers.values():
            out.append(block.attention.wo.weight)
            ff = block.feed_forward
            if isinstance(ff, MoE):
                out.append(ff.experts.w2)
                if ff.shared_experts is not None:
                    out.append(ff.shared_experts.w2.weight)
            else:
                out.append(ff.w2.weight)
        return out

    def moe_layers(self) -> list[MoE]:
        return [b.feed_forward for b in self.layers.values() if isinstance(b.feed_forward, MoE)]

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        super().init_weights(generator)
        for moe in self.moe_layers():
            moe.expert_bias.zero_()


def expert_local(t: torch.Tensor) -> torch.Tensor:
    """This rank's share of an expert weight (a DTensor's local shard)."""
    return t.to_local() if isinstance(t, DTensor) else t


def active_params_per_token(args: MoEArgs) -> int:
    """Matmul parameters one token goes through: attention, the dense or active
    feed-forward of each layer, the router, and the output projection."""
    h = args.dim
    kv = args.kv_heads * args.head_dim
    attention = h * h * 2 + h * kv * 2
    dense = 3 * h * args.ffn_hidden_dim
    routed = (
        3 * h * args.expert_hidden_dim * (args.top_k + args.n_shared_experts) + h * args.n_experts
    )
    layers = sum(
        attention + (routed if args.is_moe_layer(i) else dense) for i in range(args.n_layers)
    )
    return layers + h * args.vocab_size


def flops_per_token(args: MoEArgs, seq_len: int) -> float:
    """6 x the active matmul parameters, plus attention scores as Llama 3 counts them."""
    return 6 * active_params_per_token(args) + 12 * args.n_layers * args.dim * seq_len
