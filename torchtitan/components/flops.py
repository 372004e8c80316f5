"""Model FLOPs per token and model FLOPs utilisation (MFU) on GPUs."""

from __future__ import annotations

import torch

from torchtitan.models.llama3.args import ModelArgs

# Dense bf16 peak per device (no sparsity), from the vendors' data sheets.
_PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe card is lower (756e12), matched below
    "H100 PCIe": 756e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
}


def flops_per_token(args: ModelArgs, seq_len: int) -> float:
    """Training FLOPs per token: 6 x the matmul parameters (forward + backward)
    plus attention scores, 12 x layers x dim x seq_len (as upstream; the causal
    half is not discounted). Embedding lookups are free; the output projection
    counts (tied or not)."""
    h = args.dim
    kv = args.kv_heads * args.head_dim
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * args.ffn_hidden_dim
    matmul_params = args.n_layers * per_layer + h * args.vocab_size
    return 6 * matmul_params + 12 * args.n_layers * h * seq_len


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, or None off-GPU or for an unknown card."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    best = None
    for key, value in _PEAK_BF16_FLOPS.items():
        if key in name and (best is None or len(key) > len(best[0])):
            best = (key, value)
    return best[1] if best else None


def model_flops_utilisation(
    args: ModelArgs,
    seq_len: int,
    tokens: int,
    step_time_s: float,
    world_size: int,
    device: torch.device,
) -> float | None:
    """Share of the devices' peak spent on model FLOPs in one step (CUDA only)."""
    peak = peak_flops(device)
    if peak is None or step_time_s <= 0:
        return None
    return tokens * flops_per_token(args, seq_len) / (step_time_s * world_size * peak)
