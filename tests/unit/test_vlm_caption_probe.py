"""The caption probe's pieces (scripts/experiments/vlm_caption_probe.py): the
derangement keeps every image within its grid, and the caption mask covers caption
text only. That its measurement differs by pixels only is
tests/integration/test_vlm_caption_probe_losses.py (the losses of 250 scenes)."""

from __future__ import annotations

from pathlib import Path

import pytest
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
