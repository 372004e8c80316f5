"""The vision-language model: vision tower, merge projector, and the Llama decoder.

A micro-batch's images (`zephon.images.batch.ImageBatch`) go through the vision
tower (vision.py) and the merge projector (projector.py): one embedding per
merge window, windows in the order of the image's placeholder tokens. The
decoder's token embeddings are computed as Llama computes them, the image's
embeddings replace those of its placeholders (positions `starts[k]` onwards in
row `rows[k]`), and the Llama decoder runs from there
(`Transformer.forward_embeddings`). Labels at placeholders are ignored by the
loader, so no loss is taken on them.

The vision tower runs on every micro-step, also when the micro-batch has no
image: then on one window of zero pixels whose output, multiplied by zero, is
added to the embeddings. Every rank thus runs the same FSDP all-gathers and
reduce-scatters in the same order (a rank skipping the tower would pair its
collectives with another rank's decoder ones), the tower's gradients there are
zeros, and the gradients of a step are those of the same batch on one process.

FQNs: `vision.*`, `projector.*`, and Llama's names under `decoder.*`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from torchtitan.models.llama3.model import Transformer, copy_full_into
from torchtitan.models.vlm.args import VLMArgs
from torchtitan.models.vlm.projector import MergeProjector
from torchtitan.models.vlm.vision import LayerNorm, Linear, VisionEncoder
from zephon.images import ImageBatch


def placeholder_index(images: ImageBatch, rows: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, position) of every placeholder of `images`, image by image, window by
    window: image k's `h * w / merge²` placeholders are positions
    `starts[k] .. starts[k] + count - 1` of row `rows[k]`. ValueError naming the
    image when they leave the micro-batch's `rows` x `seq_len` inputs or overlap."""
    counts = images.tokens().cpu().numpy()
    row, start = images.rows.cpu().numpy(), images.starts.cpu().numpy()
    for k in range(len(counts)):
        if not (0 <= row[k] < rows and 0 <= start[k] and start[k] + counts[k] <= seq_len):
            raise ValueError(
                f"image {k} of the micro-batch: {counts[k]} placeholders from position "
                f"{start[k]} of row {row[k]}, outside the inputs ({rows} rows of {seq_len})"
            )
    first = np.repeat(np.cumsum(counts) - counts, counts)
    pos = np.repeat(start, counts) + np.arange(int(counts.sum())) - first
    r = np.repeat(row, counts)
    if len(np.unique(r * seq_len + pos)) != len(pos):
        raise ValueError("images of the micro-batch have overlapping placeholder positions")
    return r, pos


class VisionLanguageModel(nn.Module):
    def __init__(self, args: VLMArgs) -> None:
        super().__init__()
        self.args = args
        v = args.vision
        self.vision = VisionEncoder(v)
        self.projector = MergeProjector(
            v.dim, v.merge, v.projector_hidden_dim or args.dim, args.dim, v.norm_eps
        )
        self.decoder = Transformer(args)
        # Set by parallelize.apply_tensor_parallel: the embeddings are sharded
        # along the sequence for the decoder's blocks after the images are placed.
        self.tp_mesh: DeviceMesh | None = None

    def encode_images(self, images: ImageBatch) -> torch.Tensor:
        """`[placeholders, dim]`: the decoder embeddings of every merge window of
        `images`, image by image (the order of `placeholder_index`)."""
        v = self.args.vision
        if (images.patch_size, images.merge) != (v.patch_size, v.merge):
            raise ValueError(
                f"images of patch_size {images.patch_size}, merge {images.merge}; the model's "
                f"vision tower takes patch_size {v.patch_size}, merge {v.merge} "
                "(the recipe's [image] table must match the model flavor)"
            )
        grids = [(int(h), int(w)) for h, w in images.grids.cpu().tolist()]
        return self.projector(self.vision(images.patches, grids))

    def _dummy_window(self, device: torch.device) -> torch.Tensor:
        """The tower and projector on one window of zero pixels: `[1, dim]`."""
        m = self.args.vision.merge
        zeros = torch.zeros(m * m, self.args.vision.patch_dim, dtype=torch.uint8, device=device)
        return self.projector(self.vision(zeros, [(m, m)]))

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        images: ImageBatch | None = None,
    ) -> torch.Tensor:
        """`tokens [B, S]`, optional `positions [B, S]` and the micro-batch's images
        (rows numbered within it) -> logits `[B, S, vocab_size]`."""
        rows, seq_len = tokens.shape
        h = self.decoder.tok_embeddings(tokens)
        if images is None or images.num_images == 0:
            h = h + (self._dummy_window(tokens.device).sum() * 0).to(h.dtype)
        else:
            r, p = placeholder_index(images, rows, seq_len)
            index = (torch.from_numpy(r).to(h.device), torch.from_numpy(p).to(h.device))
            h = h.index_put(index, self.encode_images(images).to(h.dtype))
        if self.tp_mesh is not None:
            # Placed on the whole sequence, then this rank's sequence shard; the
            # backward all-gathers, so every TP peer gets the tower's full gradient.
            whole = DTensor.from_local(h, self.tp_mesh, [Replicate()], run_check=False)
            h = whole.redistribute(self.tp_mesh, [Shard(1)]).to_local()
        return self.decoder.forward_embeddings(h, seq_len, positions)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """The decoder as Llama initialises it, then the vision tower and projector,
        each parameter drawn in full from `generator` in `named_parameters` order
        and cut to this rank's shard (so the weights do not depend on sharding):
        normal(0, init_std) for linear weights, std / sqrt(2 * n_layers) for those
        writing into the tower's residual stream (attention.wo, mlp.fc2), zero
        biases, LayerNorms at weight 1, bias 0."""
        self.decoder.init_weights(generator)
        v = self.args.vision
        residual = {id(b.attention.wo.weight) for b in self.vision.layers.values()}
        residual |= {id(b.mlp.fc2.weight) for b in self.vision.layers.values()}
        gen_device = generator.device if generator is not None else torch.device("cpu")
        for module in (*self.vision.modules(), *self.projector.modules()):
            if not isinstance(module, LayerNorm | Linear):
                continue
            for name, param in module.named_parameters(recurse=False):
                full = torch.zeros(param.shape, dtype=torch.float32, device=gen_device)
                if isinstance(module, LayerNorm) and name == "weight":
                    full.fill_(1.0)
                elif isinstance(module, Linear) and name == "weight":
                    std = (
                        v.init_std / math.sqrt(2 * v.n_layers)
                        if id(param) in residual
                        else v.init_std
                    )
                    full.normal_(0.0, std, generator=generator)
                copy_full_into(param, full)
