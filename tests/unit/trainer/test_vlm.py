"""The vision-language model on one process: image placement, the vision tower's
attention and positions, the merge projector, the tower on text-only micro-batches,
the Llama decoder unchanged by its hook, and the registry entry."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.vlm import MERGE, PATCH, SEQ, VOCAB, images, random_patches, rank_batch, tiny_model

from torchtitan.config.job_config import load_job_config
from torchtitan.models import MODEL_NAMES, get_model_spec
from torchtitan.models.llama3.args import get_model_args as llama_args
from torchtitan.models.llama3.model import Transformer, document_causal_mask
from torchtitan.models.spec import count_parameters
from torchtitan.models.vlm.args import VLM_FLAVORS, get_model_args
from torchtitan.models.vlm.model import VisionLanguageModel
from torchtitan.models.vlm.vision import rope_2d
from zephon.images.pixels.patches import patch_positions, to_patches


def _tokens(rows: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(seed))
    return tokens, torch.arange(SEQ).repeat(rows, 1)


def _decoder_inputs(model: VisionLanguageModel, *args: object) -> torch.Tensor:
    """The embeddings the decoder's blocks receive (what forward placed)."""
    seen = []
    forward = model.decoder.forward_embeddings

    def record(h: torch.Tensor, *rest: object) -> torch.Tensor:
        seen.append(h)
        return forward(h, *rest)

    model.decoder.forward_embeddings = record
    model(*args)
    return seen[0]


# --------------------------------------------------------------------------- placement


def test_each_image_lands_exactly_at_its_placeholders():
    model = tiny_model()
    tokens, positions = _tokens()
    imgs = images([(2, 4), (4, 2), (2, 2)], rows=[0, 1, 0], starts=[3, 0, 10])
    with torch.no_grad():
        placed = _decoder_inputs(model, tokens, positions, imgs)
        text = model.decoder.tok_embeddings(tokens)
        windows = model.encode_images(imgs)
    assert placed.shape == (2, SEQ, model.args.dim) and windows.shape == (2 + 2 + 1, 32)
    expected = text.clone()
    first = 0
    for row, start, count in ((0, 3, 2), (1, 0, 2), (0, 10, 1)):  # count = h * w / merge²
        expected[row, start : start + count] = windows[first : first + count]
        first += count
    assert torch.equal(placed, expected)
    logits = model(tokens, positions, imgs)
    assert logits.shape == (2, SEQ, VOCAB + 3) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    ("rows", "starts", "match"),
    [
        ([0, 2], [0, 0], "image 1 of the micro-batch: 2 placeholders from position 0 of row 2"),
        ([0, 1], [0, SEQ - 1], f"image 1 .* from position {SEQ - 1} of row 1, outside"),
        ([0, 0], [0, 1], "overlapping placeholder positions"),
    ],
)
def test_placeholders_outside_the_inputs_are_refused(rows, starts, match):
    model = tiny_model()
    with pytest.raises(ValueError, match=match):
        model(*_tokens(), images([(2, 4), (2, 4)], rows=rows, starts=starts))


def test_images_of_another_patch_size_are_refused():
    imgs = dataclasses.replace(images([(2, 2)], [0], [0]), patch_size=PATCH * 2)
    with pytest.raises(ValueError, match=f"patch_size {PATCH * 2}, merge 2; the model's"):
        tiny_model()(*_tokens(), imgs)


# --------------------------------------------------------------------------- vision tower


def test_attention_stays_within_each_image():
    """Perturbing image 1's pixels changes image 1's patch vectors and nothing else."""
    model = tiny_model()
    grids = [(2, 4), (2, 2), (4, 2)]
    patches = torch.from_numpy(random_patches(grids, seed=1))
    changed = patches.clone()
    changed[8:12] = 255 - changed[8:12]  # image 1 is patches 8..11
    with torch.no_grad():
        a, b = model.vision(patches, grids), model.vision(changed, grids)
    assert torch.allclose(a[:8], b[:8], atol=1e-6) and torch.allclose(a[12:], b[12:], atol=1e-6)
    assert not torch.allclose(a[8:12], b[8:12], atol=1e-3)


def test_two_d_positions_tell_rows_from_columns():
    model = tiny_model()
    patches = torch.from_numpy(random_patches([(2, 4)], seed=2))
    with torch.no_grad():
        for block in model.vision.layers.values():  # sharper attention than at init
            block.attention.wq.weight.mul_(10)
            block.attention.wk.weight.mul_(10)
        wide = model.vision(patches, [(2, 4)])
        tall = model.vision(patches, [(4, 2)])  # the same rows, the transposed grid
    assert not torch.allclose(wide, tall, atol=1e-3)
    # The first half of the rotated pairs turn with the row, the second with the column.
    pos = patch_positions((2, 4), MERGE)
    rope, swapped = rope_2d(pos, 8, 100.0), rope_2d(pos[:, ::-1].copy(), 8, 100.0)
    assert torch.equal(rope[:, :, :2], swapped[:, :, 2:]) and torch.equal(
        rope[:, :, 2:], swapped[:, :, :2]
    )
    assert not torch.equal(rope[:, :, :2], rope[:, :, 2:])


def test_merge_projector_takes_each_window_from_its_contiguous_patches():
    """Window k of the output is the MLP of patches 4k..4k+3 side by side, and those
    are the patches of the k-th merge window of the image, in row-major order."""
    proj = tiny_model().projector
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = proj(x)
        for k in range(3):
            rows = proj.norm(x[4 * k : 4 * k + 4]).reshape(1, 64)
            assert torch.allclose(out[k], proj.fc2(F.gelu(proj.fc1(rows), approximate="tanh"))[0])
    # An image whose merge windows are painted 0, 1, 2, ...: window k's patches hold k.
    window = PATCH * MERGE
    pixels = np.kron(
        np.arange(6, dtype=np.uint8).reshape(2, 3), np.ones((window, window), np.uint8)
    )
    patches, grid = to_patches(np.repeat(pixels[:, :, None], 3, axis=2), PATCH, MERGE)
    assert grid == (4, 6)
    assert (patches.reshape(6, 4, -1) == np.arange(6)[:, None, None]).all()


def test_the_tower_runs_on_a_text_only_micro_batch():
    """No image: the tower still runs (its parameters get gradients, all zero) and the
    logits are the decoder's alone."""
    model = tiny_model()
    tokens, positions = _tokens()
    logits = model(tokens, positions, None)
    logits.float().pow(2).mean().backward()
    for name, p in [*model.vision.named_parameters(), *model.projector.named_parameters()]:
        assert p.grad is not None, name
        assert torch.count_nonzero(p.grad) == 0, name
    assert model.decoder.layers["0"].attention.wq.weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert torch.equal(logits, model.decoder(tokens, positions))


# --------------------------------------------------------------------------- decoder hook


def _main_llama_forward(model: Transformer, tokens: torch.Tensor, positions: torch.Tensor):
    """Transformer.forward as it was on main before the hook (commit abca4b9), doc_causal."""
    seq_len = tokens.shape[1]
    rope = model.rope_cache[positions]
    mask = document_causal_mask(positions)
    h = model.tok_embeddings(tokens)
    for layer in model.layers.values():
        h = layer(h, rope, mask)
    h = model.norm(h)
    assert model.output is not None and seq_len <= model.args.max_seq_len
    return model.output(h)


def test_llama_logits_are_unchanged_by_the_decoder_hook():
    model = Transformer(llama_args("debugmodel", vocab_size=256))
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(15), torch.arange(25)]).repeat(2, 1)
    with torch.no_grad():
        assert torch.equal(model(tokens, positions), _main_llama_forward(model, tokens, positions))
    assert [n for n, _ in model.named_parameters()][:2] == [
        "tok_embeddings.weight",
        "layers.0.attention_norm.weight",
    ]


# --------------------------------------------------------------------------- registry


def test_vlm_is_selected_by_name():
    assert MODEL_NAMES == ("llama3", "vlm", "moe")
    spec = get_model_spec("vlm")
    assert spec.name == "vlm" and set(spec.flavors) == {"debugmodel", "1B"}
    assert spec.state_dict_adapter is None
    args = spec.model_args("debugmodel", vocab_size=8192, attention="doc_causal")
    assert args.vocab_size == 8192 + 3  # the appended image tokens
    with torch.device("meta"):
        assert isinstance(spec.build(args), VisionLanguageModel)
    mb = rank_batch(0).micro_batches(2)[0]
    inputs = spec.inputs(mb, torch.device("cpu"))
    assert set(inputs) == {"tokens", "positions", "images"} and inputs["images"].num_images == 3
    assert set(get_model_spec("llama3").inputs(mb, torch.device("cpu"))) == {"tokens", "positions"}
    cfg = load_job_config(["--job.config_file", "train_configs/vlm_debugmodel.toml"])
    assert (cfg.model.name, cfg.data.recipe) == ("vlm", "train_configs/data/sample_vlm.toml")


def test_parameter_counts_as_documented():
    with torch.device("meta"):
        debug = VisionLanguageModel(VLM_FLAVORS["debugmodel"])
        big = VisionLanguageModel(get_model_args("1B", vocab_size=128256))
    assert count_parameters(debug) == 1_671_232
    assert count_parameters(debug) - count_parameters(debug.decoder) == 161_984
    assert count_parameters(big) == 1_551_324_160
    assert count_parameters(big) - count_parameters(big.decoder) == 315_503_616
