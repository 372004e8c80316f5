"""The caption probe's measurement is honest: the shuffled run differs from the
right one by pixels only (scripts/experiments/vlm_caption_probe.py). No training,
but the caption losses of a freshly initialised debugmodel over 250 held-out scenes,
twice (tens of seconds in process); the probe's quick checks are
tests/unit/test_vlm_caption_probe.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import vlm_caption_probe as probe


@pytest.fixture(scope="module")  # as in tests/unit/test_vlm_caption_probe.py
def heldout(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, object]:
    work = tmp_path_factory.mktemp("probe")
    _, held = probe.build_corpus(Path(work), train_images=1, heldout=250)
    return probe.heldout_batches(held)


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
