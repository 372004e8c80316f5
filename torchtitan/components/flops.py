"""Model FLOPs utilisation (MFU) on GPUs: a model's FLOPs per token (from its spec)
against the devices' dense bf16 peak."""

from __future__ import annotations

import torch

# Dense bf16 peak per device (no sparsity), from the vendors' data sheets.
_PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe card is lower (756e12), matched below
    "H100 PCIe": 756e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
}


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
    flops_per_token: float,
    tokens: int,
    step_time_s: float,
    world_size: int,
    device: torch.device,
) -> float | None:
    """Share of the devices' peak spent on model FLOPs in one step (CUDA only);
    `flops_per_token` is the model's training FLOPs per token."""
    peak = peak_flops(device)
    if peak is None or step_time_s <= 0:
        return None
    return tokens * flops_per_token / (step_time_s * world_size * peak)
