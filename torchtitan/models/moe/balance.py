"""Routing balance that does not depend on the GPU count (docs/design.md §17).

Every quantity the update reads is counted over the whole global batch (all
data-parallel ranks and all micro-batches of the step, summed by `reduce`),
never per rank or per micro-batch:

- `bias` (DeepSeek-V3's auxiliary-loss-free balance): after each applied step,
  every expert's routing bias moves by `bias_update_rate` towards balance, by
  the sign of (mean load - its load) over the step's tokens. No loss term.
- `global_aux` (global-batch load balancing): the loss `coef * E * sum_i f_i P_i`
  with `f_i` the share of the step's routing choices that went to expert i and
  `P_i` its mean router score, both over the global batch. `f` is counted by a
  forward pass without gradients before the step's micro-batches (the same
  parameters route the same way), so every micro-batch adds its exact share.
- `micro_batch_aux`: the same loss with `f` and `P` over each micro-batch,
  averaged over them: what most implementations do, kept to show what the GPU
  count does to it.
- the router z-loss (`z_loss_coef`): the mean squared log-sum-exp of the router
  logits over the global batch's tokens.

The tokens that count are those with a target (`labels != -100`): the data
decides them, never the padding a rank adds.

Loss terms are returned in the trainer's units: the loss a rank adds to its
summed token loss after scaling it by `dp / valid tokens` (FSDP then averages
over the data-parallel ranks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchtitan.config.job_config import MoEConfig
from torchtitan.models.moe.model import MoE

OFF, COUNT, TRAIN = "off", "count", "train"


class LayerBalance:
    """One MoE layer's routing during a step: what it counts and adds to the loss."""

    def __init__(self, moe: MoE, owner: RoutingBalance):
        self.moe, self.owner = moe, owner
        n = moe.n_experts
        device = moe.expert_bias.device
        self.counts = torch.zeros(n, dtype=torch.float64, device=device)
        """Routing choices per expert of this step's training forward passes (local)."""
        self.pass_counts = torch.zeros(n, dtype=torch.float64, device=device)
        """The same from the count pass (global_aux), summed over the global batch."""
        moe.observe = self.observe

    def observe(
        self,
        logits: torch.Tensor,
        scores: torch.Tensor,
        chosen: torch.Tensor,
        counted: torch.Tensor,
    ) -> None:
        o = self.owner
        if o.mode == OFF:
            return
        choices = torch.bincount(chosen[counted].reshape(-1), minlength=self.moe.n_experts)
        if o.mode == COUNT:
            self.pass_counts += choices.to(torch.float64)
            return
        self.counts += choices.to(torch.float64)
        cfg, n, k = o.cfg, self.moe.n_experts, self.moe.top_k
        probs = scores[counted]
        if self.moe.score_func == "sigmoid":
            probs = probs / probs.sum(-1, keepdim=True)
        extra = None
        if cfg.balance == "global_aux" and cfg.aux_loss_coef:
            freq = self.pass_counts / max(o.tokens * k, 1)
            term = (freq.to(probs.dtype) * probs.sum(0)).sum() * (n / max(o.tokens, 1))
            extra = cfg.aux_loss_coef * o.dp * term
        elif cfg.balance == "micro_batch_aux" and cfg.aux_loss_coef and probs.shape[0]:
            freq = choices.to(probs.dtype) / (probs.shape[0] * k)
            term = n * (freq * probs.mean(0)).sum()
            extra = cfg.aux_loss_coef * term / o.micro_batches
        if cfg.z_loss_coef:
            z = logits[counted].logsumexp(-1).pow(2).sum() / max(o.tokens, 1)
            z_term = cfg.z_loss_coef * o.dp * z
            extra = z_term if extra is None else extra + z_term
        if extra is not None:
            o.pending = extra if o.pending is None else o.pending + extra


class RoutingBalance:
    """The training hooks (models/spec.py `TrainingHooks`) of a mixture of experts."""

    def __init__(
        self,
        moes: list[MoE],
        cfg: MoEConfig,
        dp: int,
        reduce: Callable[[torch.Tensor], None],
        expert_params: list[torch.nn.Parameter],
    ):
        """`reduce`: sums a tensor over the global batch's ranks in place (collective);
        `expert_params`: the expert weights kept out of FSDP (expert parallelism),
        whose gradients are divided by `dp` after backward."""
        self.cfg, self.dp, self.reduce = cfg, dp, reduce
        self.expert_params = expert_params
        self.mode = OFF
        self.tokens = 0  # the global batch's counted tokens
        self.micro_batches = 1
        self.pending: torch.Tensor | None = None
        self.layers = [LayerBalance(m, self) for m in moes]
        self._loads: torch.Tensor | None = None

    def begin_step(self, tokens: int, micro_batches: int, count_pass: Callable[[], None]) -> None:
        """`tokens`: the global batch's tokens with a target; `count_pass`: a forward
        pass over this rank's micro-batches without gradients (global_aux counts the
        routing with it first; collective)."""
        self.tokens, self.micro_batches = tokens, micro_batches
        for layer in self.layers:
            layer.counts.zero_()
            layer.pass_counts.zero_()
        if self.cfg.balance == "global_aux":
            self.mode = COUNT
            count_pass()
            counts = torch.stack([layer.pass_counts for layer in self.layers])
            self.reduce(counts)
            for layer, row in zip(self.layers, counts, strict=True):
                layer.pass_counts.copy_(row)
        self.mode = TRAIN

    def extra_loss(self) -> torch.Tensor | None:
        """The loss terms of the micro-batch just forwarded (trainer units), or None."""
        extra, self.pending = self.pending, None
        return extra

    def end_backward(self) -> dict[str, float]:
        """Collective: the step's expert loads over the global batch, and their
        statistics; the expert-parallel gradients put on the others' scale."""
        self.mode = OFF
        for p in self.expert_params:
            if p.grad is not None:
                p.grad.div_(self.dp)
        loads = torch.stack([layer.counts for layer in self.layers])
        self.reduce(loads)
        self._loads = loads
        shares = loads / loads.sum(1, keepdim=True).clamp(min=1)
        mean = loads.mean(1, keepdim=True).clamp(min=1e-12)
        return {
            "expert_share_min": float(shares.min()),
            "expert_share_max": float(shares.max()),
            "expert_imbalance": float((loads / mean).max()),
        }

    @torch.no_grad()
    def end_step(self, applied: bool) -> None:
        """After the step: the routing biases move by its loads if it was applied."""
        self.mode = OFF
        if not applied or self.cfg.balance != "bias" or self._loads is None:
            return
        for layer, load in zip(self.layers, self._loads, strict=True):
            bias = layer.moe.expert_bias
            bias += self.cfg.bias_update_rate * torch.sign(load.mean() - load).to(bias.dtype)
        self._loads = None
