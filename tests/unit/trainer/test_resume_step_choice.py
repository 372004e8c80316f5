"""The loss a checkpoint's manifest records, and the resume step chosen when the newest
checkpoint is marked not finite (torchtitan/components/checkpoint/manifest.py): a plain
relaunch never resumes from it silently; it names the newest finite one instead, or says
there is none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchtitan.components.checkpoint import manifest
from torchtitan.components.checkpoint.manifest import COMPLETE_FILE, LOADER_FILE, CheckpointError


def save_step(root: Path, step: int, finite: bool = True, loss: float | None = None) -> Path:
    """A step folder as a save leaves it: a shard, the loader state, then the manifest."""
    d = root / f"step-{step}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"shard of step %d" % step)
    (d / LOADER_FILE).write_text(json.dumps({"format": "zephon.loader_state", "step": step}))
    files = manifest.file_entries(str(d), manifest.files_of_rank(str(d), 0))
    doc = manifest.manifest_document(step, 1, files, finite, loss)
    (d / COMPLETE_FILE).write_text(json.dumps(doc))
    return d


def refusal(call) -> str:
    with pytest.raises(CheckpointError) as info:
        call()
    return str(info.value)


def test_the_manifest_records_the_loss_only_when_given():
    with_loss = manifest.manifest_document(3, 2, {}, finite=False, loss=2.75)
    assert (with_loss["loss"], with_loss["finite"]) == (2.75, False)
    assert "loss" not in manifest.manifest_document(3, 2, {})
    assert manifest.manifest_document(3, 2, {}, loss=0.0)["loss"] == 0.0  # zero is a loss


def test_a_steps_loss_is_read_back_from_its_manifest(tmp_path):
    save_step(tmp_path, 4, loss=2.5)
    save_step(tmp_path, 6, loss=3)  # an integer loss reads as a float
    save_step(tmp_path, 8)  # the trainer did not compute one
    folder = str(tmp_path)
    assert manifest.step_loss(folder, 4) == 2.5
    assert manifest.step_loss(folder, 6) == 3.0 and isinstance(manifest.step_loss(folder, 6), float)
    assert manifest.step_loss(folder, 8) is None
    assert manifest.step_loss(folder, 10) is None  # no such step


def test_a_loss_that_is_not_a_number_or_an_unreadable_manifest_gives_none(tmp_path):
    for step, text in (
        (1, '{"loss": "2.5"}'),
        (2, "[2.5]"),
        (3, "not json"),
        (4, '{"loss": null}'),
    ):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / COMPLETE_FILE).write_text(text)
    assert [manifest.step_loss(str(tmp_path), s) for s in (1, 2, 3, 4)] == [None] * 4


def test_a_nonfinite_newest_checkpoint_is_refused_naming_the_newest_finite_one(tmp_path):
    save_step(tmp_path, 2)
    save_step(tmp_path, 4)
    save_step(tmp_path, 6, finite=False)
    save_step(tmp_path, 8, finite=False)
    folder = str(tmp_path)
    assert refusal(lambda: manifest.select_resume_step(folder, -1, "full")) == (
        f"the latest checkpoint, step 8, is marked not finite (its update was skipped as the "
        f"run diverged: {folder}/step-8/{COMPLETE_FILE}); the newest finite one is step 4: "
        "resume from it with --checkpoint.load_step 4 (after changing what made the run "
        "diverge), or pass --checkpoint.load_step 8 to resume from it anyway"
    )
    # Asked for by step, either is taken: the step asked for, verified.
    assert manifest.select_resume_step(folder, 8, "full") == 8
    assert manifest.select_resume_step(folder, 4, "full") == 4


def test_without_any_finite_checkpoint_the_refusal_says_so(tmp_path):
    save_step(tmp_path, 3, finite=False)
    save_step(tmp_path, 5, finite=False)
    folder = str(tmp_path)
    assert refusal(lambda: manifest.select_resume_step(folder, -1, "size")) == (
        f"the latest checkpoint, step 5, is marked not finite (its update was skipped as the "
        f"run diverged: {folder}/step-5/{COMPLETE_FILE}); no checkpoint is finite, or pass "
        "--checkpoint.load_step 5 to resume from it anyway"
    )


def test_a_finite_newest_checkpoint_is_taken_whatever_came_before(tmp_path):
    save_step(tmp_path, 2, finite=False)
    save_step(tmp_path, 4)
    assert manifest.select_resume_step(str(tmp_path), -1, "full") == 4
