"""Hyper-parameters of the vision-language model and its named flavors.

`VLMArgs` is the Llama decoder's `ModelArgs` plus a `VisionArgs` for the
vision tower, so the decoder is built from the same object and the trainer's
reads (`vocab_size`, `max_seq_len`) and replacement (`attention_impl`) work
unchanged. `vocab_size` includes the three image tokens that
`zephon.images.tokens` appends after the tokenizer's vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from torchtitan.models.llama3.args import LLAMA3_FLAVORS, ModelArgs
from zephon.images import vocab_size_with_image_tokens


@dataclass(frozen=True)
class VisionArgs:
    patch_size: int = 14
    """Pixels a patch side; must equal the recipe's `[image] patch_size`."""
    merge: int = 2
    """merge x merge patches become one decoder token; must equal `[image] merge`."""
    dim: int = 1024
    n_layers: int = 24
    n_heads: int = 16
    ffn_hidden_dim: int = 4096
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    """Base of the 2-D rotary frequencies (half the pairs rotate by row, half by column)."""
    projector_hidden_dim: int | None = None
    """Hidden width of the merge projector's MLP; None = the decoder's dim."""
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge", "dim", "n_layers", "n_heads", "ffn_hidden_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"vision.{name}: expected an integer >= 1, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(
                f"vision.dim {self.dim} is not divisible by vision.n_heads {self.n_heads}"
            )
        if self.head_dim % 4:
            raise ValueError(
                f"vision head_dim {self.head_dim} (dim / n_heads) must be a multiple of 4: "
                "2-D rotary embeddings rotate half the pairs by row, half by column"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def patch_dim(self) -> int:
        """Values in one uint8 patch row: 3 channels x patch_size²."""
        return 3 * self.patch_size * self.patch_size


@dataclass(frozen=True)
class VLMArgs(ModelArgs):
    vision: VisionArgs = field(default_factory=VisionArgs)


def _with_vision(decoder: ModelArgs, vision: VisionArgs) -> VLMArgs:
    base = {f.name: getattr(decoder, f.name) for f in dataclasses.fields(ModelArgs)}
    base["vocab_size"] = vocab_size_with_image_tokens(decoder.vocab_size)
    return VLMArgs(**base, vision=vision)


VLM_FLAVORS: dict[str, VLMArgs] = {
    # Llama debugmodel decoder (128 wide, 4 layers) and a 2-layer, 64-wide vision
    # tower on 8-pixel patches: the tower and projector are 161,984 parameters; in
    # all 1,671,232 as listed (2048 + 3 tokens), 3,244,096 with the committed
    # 8192-token tokenizer. Trains on 2 CPU processes.
    "debugmodel": _with_vision(
        LLAMA3_FLAVORS["debugmodel"],
        VisionArgs(patch_size=8, merge=2, dim=64, n_layers=2, n_heads=2, ffn_hidden_dim=256),
    ),
    # Llama 3.2 1B decoder and a ViT-L-shaped tower (24 x 1024, 14-pixel patches,
    # 2 x 2 merge): 1,551,324,160 parameters, the tower and projector 315,503,616.
    "1B": _with_vision(LLAMA3_FLAVORS["1B"], VisionArgs()),
}


def get_model_args(flavor: str, **overrides: object) -> VLMArgs:
    """The named flavor with `overrides` applied. `vocab_size` is the tokenizer's:
    the model's is three larger (the appended image tokens, zephon/images/tokens.py)."""
    if flavor not in VLM_FLAVORS:
        raise ValueError(f"unknown vlm flavor {flavor!r}: expected one of {list(VLM_FLAVORS)}")
    tokenizer_vocab = overrides.get("vocab_size")
    if isinstance(tokenizer_vocab, int):
        overrides["vocab_size"] = vocab_size_with_image_tokens(tokenizer_vocab)
    return dataclasses.replace(VLM_FLAVORS[flavor], **overrides)
