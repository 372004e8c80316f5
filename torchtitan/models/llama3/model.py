"""A Llama-3-style decoder-only transformer.

Structure (FQNs matter for checkpoints): ``tok_embeddings``, ``layers.<i>``
(``attention_norm``, ``attention.{wq,wk,wv,wo}``, ``ffn_norm``,
``feed_forward.{w1,w2,w3}``), ``norm``, ``output`` (absent when tied).

Packed rows: ``positions`` restart at 0 at every document start. In
``doc_causal`` mode rotary embeddings use those positions and attention is
causal within each document only, so a packed document is computed exactly as
if it were alone in its row.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.attention.flex_attention import BlockMask
from torch.utils.checkpoint import checkpoint

from torchtitan.models.llama3.args import ModelArgs, RopeScaling
from torchtitan.models.llama3.flex import document_block_mask, flex_doc_attention

# None = plain causal; a boolean tensor = dense SDPA mask; a BlockMask = FlexAttention.
Mask = torch.Tensor | BlockMask | None

# --------------------------------------------------------------------------- rotary


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies (float64, CPU) for the ``head_dim // 2`` rotated pairs."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling is None:
        return inv_freq
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = scaling.original_max_seq_len / scaling.low_freq_factor
    high_wavelen = scaling.original_max_seq_len / scaling.high_freq_factor
    # 0 for long wavelengths (fully scaled) .. 1 for short ones (kept), linear in between.
    smooth = (scaling.original_max_seq_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smooth = smooth.clamp(0.0, 1.0)
    smooth = torch.where(wavelen < high_wavelen, 1.0, smooth)
    smooth = torch.where(wavelen > low_wavelen, 0.0, smooth)
    return (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq


def build_rope_cache(args: ModelArgs) -> torch.Tensor:
    """``[max_seq_len, head_dim // 2, 2]`` float32 table of (cos, sin) per position.

    Angles are computed in float64: at positions in the thousands float32 loses
    about 1e-3 rad."""
    inv_freq = rope_frequencies(args.head_dim, args.rope_theta, args.rope_scaling)
    angles = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float64), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, S, H, D]`` by ``rope [B or 1, S, D/2, 2]``.

    Pairs are adjacent elements (2i, 2i+1), the layout of Meta's Llama weights."""
    cos = rope[..., 0].unsqueeze(2)
    sin = rope[..., 1].unsqueeze(2)
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


def document_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, 1, S, S]`` mask (True = may attend): causal and within the
    same document, where a document starts at every ``positions == 0``."""
    seq_len = positions.shape[1]
    doc_id = torch.cumsum(positions == 0, dim=1)
    same_doc = doc_id.unsqueeze(2) == doc_id.unsqueeze(1)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=positions.device).tril()
    return (same_doc & causal).unsqueeze(1)


# --------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 even under bf16 mixed precision.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


class Attention(nn.Module):
    """Grouped-query attention: ``n_kv_heads`` key/value heads shared by groups of
    query heads."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.kv_heads
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: Mask) -> torch.Tensor:
        bsz, seq_len, _ = x.shape
        # -1 heads: under tensor parallelism this rank projects only its share.
        q = self.wq(x).view(bsz, seq_len, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq_len, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq_len, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)

        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        if isinstance(mask, BlockMask):
            out = flex_doc_attention(q, k, v, mask)
        else:
            # Expand kv heads explicitly rather than SDPA's enable_gqa, which not every
            # backend supports together with an explicit mask.
            groups = q.shape[1] // k.shape[1]
            if groups > 1:
                k = k.repeat_interleave(groups, dim=1)
                v = v.repeat_interleave(groups, dim=1)
            if mask is None:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(bsz, seq_len, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        # Set by parallelize.apply_activation_checkpointing. A flag instead of a wrapper module
        # keeps parameter names (and so checkpoints) identical with AC on or off.
        self.checkpoint_activations = False

    def _block(self, x: torch.Tensor, rope: torch.Tensor, mask: Mask) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: Mask) -> torch.Tensor:
        if self.checkpoint_activations and torch.is_grad_enabled():
            return checkpoint(self._block, x, rope, mask, use_reentrant=False)
        return self._block(x, rope, mask)


# --------------------------------------------------------------------------- model


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        # ModuleDict keyed "0".."n-1": same FQNs as a list, and layers can be
        # removed (e.g. for pipeline stages) without renumbering.
        self.layers = nn.ModuleDict(
            {str(i): self.make_block(args, i) for i in range(args.n_layers)}
        )
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # Tied: project with the embedding matrix in forward instead of sharing a
        # Parameter object, which survives to_empty() and FSDP sharding untouched.
        self.output = (
            None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        )
        # Derived from args, so never checkpointed (non-persistent).
        self.register_buffer("rope_cache", build_rope_cache(args), persistent=False)

    def make_block(self, args: ModelArgs, layer: int) -> nn.Module:
        """Layer `layer`'s block (a model family with other blocks overrides this)."""
        return TransformerBlock(args)

    def residual_weights(self, whole: nn.Module) -> list[torch.Tensor]:
        """The projections that write into the residual stream (initialised smaller)."""
        out = []
        for block in whole.layers.values():
            out += [block.attention.wo.weight, block.feed_forward.w2.weight]
        return out

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens [B, S]`` (and optional per-document ``positions [B, S]``) ->
        logits ``[B, S, vocab_size]``."""
        return self.forward_embeddings(self.tok_embeddings(tokens), tokens.shape[1], positions)

    def forward_embeddings(
        self, h: torch.Tensor, seq_len: int, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The decoder from input embeddings: ``h [B, S, dim]`` (under tensor
        parallelism this rank's sequence shard of them; ``seq_len`` is the whole
        S) -> logits ``[B, S, vocab_size]``. A model that puts other embeddings
        at some positions (image features) calls this instead of ``forward``."""
        rope, mask = self.rope_and_mask(seq_len, positions)
        for layer in self.layers.values():
            h = layer(h, rope, mask)
        return self.project(h)

    def rope_and_mask(
        self, seq_len: int, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, Mask]:
        """What every block reads besides the hidden state: the rotary table for
        these positions and the attention mask (None = plain causal)."""
        if seq_len > self.args.max_seq_len:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_seq_len {self.args.max_seq_len}"
            )
        if positions is None or self.args.attention == "causal":
            return self.rope_cache[:seq_len].unsqueeze(0), None
        rope = self.rope_cache[positions]
        if self.args.attention_impl == "flex":
            return rope, document_block_mask(positions)
        return rope, document_causal_mask(positions)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and output projection: the last hidden state -> logits."""
        h = self.norm(h)
        if self.output is None:
            return F.linear(h, self.tok_embeddings.weight)
        return self.output(h)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Initialise every parameter and recompute the rotary cache.

        Each parameter is drawn in full, in ``named_parameters`` order, from
        ``generator`` (CPU default generator when None) and then cut to this
        rank's shard, so the weights depend only on the seed and the generator's
        device -- not on the world size, the pipeline split, or whether FSDP was applied yet. Works
        after ``to_empty()`` of a meta-device model. Costs one full-size tensor
        per parameter in turn on the generator's device.

        Scheme: normal(0, init_std) for embeddings and input projections;
        init_std / sqrt(2 * n_layers) for the projections that write into the
        residual stream (attention.wo, feed_forward.w2), so its variance does not
        grow with depth; ones for norms.
        """
        self.rope_cache.copy_(build_rope_cache(self.args).to(self.rope_cache.device))

        std = self.args.init_std
        residual_std = std / math.sqrt(2 * self.args.n_layers)
        # The whole model's parameters, in order, even when this one holds a pipeline
        # stage's share: the draws, and so every weight, do not depend on the split.
        with torch.device("meta"):
            whole = type(self)(self.args) if _is_pruned(self) else self
        norm_params = {id(m.weight) for m in whole.modules() if isinstance(m, RMSNorm)}
        residual_params = {id(w) for w in self.residual_weights(whole)}

        mine = dict(self.named_parameters())
        gen_device = generator.device if generator is not None else torch.device("cpu")
        for name, param in whole.named_parameters():
            full = torch.empty(param.shape, dtype=torch.float32, device=gen_device)
            if id(param) in norm_params:
                full.fill_(1.0)
            else:
                p_std = residual_std if id(param) in residual_params else std
                full.normal_(0.0, p_std, generator=generator)
            if name in mine:
                copy_full_into(mine[name], full)


def _is_pruned(model: Transformer) -> bool:
    """Whether `model` holds only a pipeline stage's share of its layers."""
    return (
        len(model.layers) != model.args.n_layers
        or model.tok_embeddings is None
        or (model.norm is None)
    )


def copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full (unsharded) tensor into ``param``, which may be an FSDP2 DTensor."""
    if isinstance(param, DTensor):
        local = param.to_local()
        # src_data_rank=None: every rank holds the same full tensor, so each slices
        # its own shard locally instead of receiving it from rank 0.
        shard = distribute_tensor(
            full.to(local.device), param.device_mesh, param.placements, src_data_rank=None
        )
        local.copy_(shard.to_local())
    else:
        param.copy_(full)
