"""The caption probe's measurement is honest: the shuffled run differs from the
right one by pixels only (scripts/vlm_caption_probe.py).

No training: a freshly initialised debugmodel on a few held-out scenes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import vlm_caption_probe as probe

from zephon.batch import IGNORE_INDEX


def test_derangement_moves_every_image_within_its_grid() -> None:
    grids = [(4, 4), (2, 8), (4, 4), (4, 4), (2, 8), (8, 8), (8, 8)]
    perm = probe.derangement(grids)
    assert sorted(perm) == list(range(len(grids)))  # a permutation
    for i, j in enumerate(perm):
        assert j != i and grids[j] == grids[i], (i, j)
    with pytest.raises(ValueError, match=r"grid \(3, 3\) has one image"):
        probe.derangement([*grids, (3, 3)])


@pytest.fixture(scope="module")
def heldout(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, object]:
    work = tmp_path_factory.mktemp("probe")
    _, held = probe.build_corpus(Path(work), train_images=1, heldout=250)
    return probe.heldout_batches(held)


def test_caption_mask_is_caption_text_only(heldout: tuple[list, object]) -> None:
    batches, tok = heldout
    for batch in batches:
        mask = probe.caption_mask(batch.labels, tok)
        image_tokens = batch.labels == IGNORE_INDEX  # image targets are ignored
        assert not (mask & image_tokens).any()
        assert not (mask & (batch.labels == tok.eos_id)).any()
        # every caption has text: at least one masked target per image
        assert int(mask.sum()) >= batch.images.num_images


def test_shuffled_run_differs_by_pixels_only(heldout: tuple[list, object]) -> None:
    batches, tok = heldout
    model = probe.load_model_args_only(tok.vocab_size)
    got = probe.caption_losses(model, batches, tok)
    assert got["images_moved"] == got["images"] > 0
    assert got["loss_right_image"] != got["loss_shuffled_images"]  # pixels reach the loss
    # With the projector's output zeroed, the pixels no longer matter: the two runs
    # must then agree exactly (same tokens, positions, placeholders and targets).
    with torch.no_grad():
        for p in model.projector.parameters():
            p.zero_()
    blind = probe.caption_losses(model, batches, tok)
    assert blind["loss_right_image"] == blind["loss_shuffled_images"]
    assert blind["caption_tokens"] == got["caption_tokens"]
