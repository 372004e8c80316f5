"""Host-to-device copies of batches. GPU only: pinned staging and non-blocking
copies, so the copy overlaps with work already queued on the device."""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; on CPU the tensor itself, no copy."""
    if device.type != "cuda":
        return t.to(device)
    # A pageable source makes the copy synchronous; pinning first lets it run
    # asynchronously on the current stream (which orders it before its use).
    return t.pin_memory().to(device, non_blocking=True)
