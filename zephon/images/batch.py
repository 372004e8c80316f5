"""The images of a batch: what the loader hands the model beside the token rows.

One `ImageBatch` holds every image of a rank's rows for one step, in
canonical order (by row, then by position in the row), so that concatenating
the ranks' images in rank order gives the global batch's images in lane
order, like the rows themselves (docs/design.md §14).

- `patches`: uint8 `[total_patches, 3 * p * p]`, each image's patches in the
  order of `zephon/images/pixels/patches.py` (merge windows contiguous), images
  one after another. uint8 keeps digests exact and memory at a quarter of
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
    patches: torch.Tensor
    grids: torch.Tensor
    rows: torch.Tensor
    starts: torch.Tensor
    patch_size: int
    merge: int

    @property
    def num_images(self) -> int:
        return int(self.grids.shape[0])

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
            patches=self.patches[a:b],
            grids=self.grids[keep],
            rows=self.rows[keep] - first,
            starts=self.starts[keep],
            patch_size=self.patch_size,
            merge=self.merge,
        )

    @staticmethod
    def from_numpy(
        patches: np.ndarray,
        grids: np.ndarray,
        rows: np.ndarray,
        starts: np.ndarray,
        patch_size: int,
        merge: int,
    ) -> ImageBatch:
        import torch

        return ImageBatch(
            patches=torch.from_numpy(np.ascontiguousarray(patches, dtype=np.uint8)),
            grids=torch.from_numpy(np.asarray(grids, dtype=np.int64).reshape(-1, 2)),
            rows=torch.from_numpy(np.asarray(rows, dtype=np.int64)),
            starts=torch.from_numpy(np.asarray(starts, dtype=np.int64)),
            patch_size=patch_size,
            merge=merge,
        )
