"""The images of a batch: what the loader hands the model beside the token rows.

One `ImageBatch` holds every image of a rank's rows for one step, in
canonical order (by row, then by position in the row), so that concatenating
the ranks' images in rank order gives the global batch's images in lane
order, like the rows themselves (docs/design.md §14).

- `parts`: the patches, uint8 `[patches, 3 * p * p]` each, whose concatenation
  is every image's patches one after another, each image's in the order of
  `zephon/images/pixels/patches.py` (merge windows contiguous). The loader
  hands one part per image: views of the memory its decoder wrote them into
  (images/shared_patches.py), so no pixel is copied to make the batch; the
  consumer joins them once, into the memory the model reads
  (`patches_on(device)`). uint8 keeps digests exact and memory at a quarter of
  float32; the model normalises.
- `grids`: int64 `[n, 2]`, each image's (h_patches, w_patches).
- `rows`: int64 `[n]`, the row of the batch each image sits in.
- `starts`: int64 `[n]`, the input position of the image's first placeholder
  token; its `h * w / merge**2` placeholders follow, all inside the row's
  inputs (packing never splits an image and keeps its placeholders off the
  row's last token, which is only a label).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass
class ImageBatch:
    parts: tuple[torch.Tensor, ...]
    grids: torch.Tensor
    rows: torch.Tensor
    starts: torch.Tensor
    patch_size: int
    merge: int

    @property
    def num_images(self) -> int:
        return int(self.grids.shape[0])

    @property
    def patch_width(self) -> int:
        return 3 * self.patch_size * self.patch_size

    @property
    def patches(self) -> torch.Tensor:
        """Every image's patches in one tensor `[total_patches, 3 * p * p]` (joined
        here, a copy, when the batch holds more than one part)."""
        return self.patches_on(None)

    def patches_on(self, device: torch.device | None) -> torch.Tensor:
        """The patches in one tensor on `device` (None: where the parts are); each
        part is copied once, straight into its place."""
        import torch

        if len(self.parts) == 1 and (device is None or self.parts[0].device == device):
            return self.parts[0]
        total = sum(int(p.shape[0]) for p in self.parts)
        where = device if device is not None else (self.parts[0].device if self.parts else None)
        out = torch.empty((total, self.patch_width), dtype=torch.uint8, device=where)
        at = 0
        for p in self.parts:
            out[at : at + p.shape[0]].copy_(p, non_blocking=out.device.type == "cuda")
            at += int(p.shape[0])
        return out

    def tokens(self) -> torch.Tensor:
        """Placeholder tokens of each image: h * w / merge**2."""
        return self.grids[:, 0] * self.grids[:, 1] // (self.merge * self.merge)

    def patch_offsets(self) -> torch.Tensor:
        """int64 `[n + 1]`: image k's patches are patches[offsets[k]:offsets[k + 1]]."""
        import torch

        counts = self.grids[:, 0] * self.grids[:, 1]
        return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])

    def select_rows(self, first: int, last: int) -> ImageBatch:
        """The images of rows [first, last), with rows renumbered from 0 (a micro-batch)."""
        keep = ((self.rows >= first) & (self.rows < last)).nonzero().flatten()
        offsets = self.patch_offsets()
        if len(keep):
            a, b = int(offsets[int(keep[0])]), int(offsets[int(keep[-1]) + 1])
        else:
            a = b = 0
        return ImageBatch(
            parts=_slice_parts(self.parts, a, b),
            grids=self.grids[keep],
            rows=self.rows[keep] - first,
            starts=self.starts[keep],
            patch_size=self.patch_size,
            merge=self.merge,
        )

    @staticmethod
    def from_numpy(
        patches: np.ndarray | list[np.ndarray],
        grids: np.ndarray,
        rows: np.ndarray,
        starts: np.ndarray,
        patch_size: int,
        merge: int,
    ) -> ImageBatch:
        """`patches`: one array of every image's patches, or a part per image (kept as
        they are: views, not copies)."""
        import torch

        arrays = [patches] if isinstance(patches, np.ndarray) else patches
        width = 3 * patch_size * patch_size
        return ImageBatch(
            parts=tuple(
                torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8).reshape(-1, width))
                for a in arrays
            ),
            grids=torch.from_numpy(np.asarray(grids, dtype=np.int64).reshape(-1, 2)),
            rows=torch.from_numpy(np.asarray(rows, dtype=np.int64)),
            starts=torch.from_numpy(np.asarray(starts, dtype=np.int64)),
            patch_size=patch_size,
            merge=merge,
        )


def _slice_parts(parts: tuple[torch.Tensor, ...], a: int, b: int) -> tuple[torch.Tensor, ...]:
    """Patches [a, b) of the concatenation of `parts`, as views of the parts."""
    out, at = [], 0
    for p in parts:
        n = int(p.shape[0])
        lo, hi = max(a - at, 0), min(b - at, n)
        if lo < hi:
            out.append(p[lo:hi])
        at += n
    return tuple(out)
