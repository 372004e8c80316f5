"""A checkpoint step's manifest and its verification, rule by rule and word for word
(torchtitan/components/checkpoint/manifest.py).

Step folders here are small files named as DCP writes them (no torch): what the
manifest lists, checks and reports does not depend on what the files hold.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest
import xxhash

from torchtitan.components.checkpoint import manifest
from torchtitan.components.checkpoint.manifest import (
    COMPLETE_FILE,
    LOADER_FILE,
    CheckpointError,
    Verified,
)

SHARDS = {"__0_0.distcp": b"rank 0 shard", ".metadata": b"dcp metadata", "extra.bin": b"x" * 40}


def step_folder(root: Path, step: int, loader_step: int | None = None, finite: bool = True) -> Path:
    d = root / f"step-{step}"
    d.mkdir(parents=True)
    for name, data in SHARDS.items():
        (d / name).write_bytes(data)
    loader = {"format": "zephon.loader_state", "step": step if loader_step is None else loader_step}
    (d / LOADER_FILE).write_text(json.dumps(loader))
    files = manifest.file_entries(str(d), manifest.files_of_rank(str(d), 0))
    doc = manifest.manifest_document(step, 1, files, finite)
    (d / COMPLETE_FILE).write_text(json.dumps(doc))
    return d


def edit_manifest(d: Path, **changes: object) -> None:
    doc = json.loads((d / COMPLETE_FILE).read_text())
    doc.update(changes)
    (d / COMPLETE_FILE).write_text(json.dumps(doc))


def refusal(call) -> str:
    with pytest.raises(CheckpointError) as info:
        call()
    return str(info.value)


# -- what a save writes ---------------------------------------------------------------------


def test_checksums_are_xxh3_64_of_the_whole_file(tmp_path):
    data = bytes(range(256)) * 41
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert manifest.file_checksum(str(tmp_path / "f")) == xxhash.xxh3_64(data).hexdigest()
    assert manifest.file_checksum(str(tmp_path / "empty")) == xxhash.xxh3_64(b"").hexdigest()
    entries = manifest.file_entries(str(tmp_path), ["f", "empty"])
    assert entries == {
        "empty": {"size": 0, "xxh3_64": xxhash.xxh3_64(b"").hexdigest()},
        "f": {"size": len(data), "xxh3_64": xxhash.xxh3_64(data).hexdigest()},
    }
    assert list(entries) == ["empty", "f"]


def test_each_rank_lists_its_own_shards_and_rank_0_everything_else(tmp_path):
    names = [
        "__0_0.distcp", "__1_0.distcp", "__1_1.distcp", "__10_0.distcp", ".metadata",
        LOADER_FILE, "__x_0.distcp", COMPLETE_FILE, ".tmp-__1_2.distcp",
    ]  # fmt: skip
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert sorted(manifest.files_of_rank(str(tmp_path), 0)) == [
        ".metadata", "__0_0.distcp", "__x_0.distcp", LOADER_FILE,
    ]  # fmt: skip
    assert sorted(manifest.files_of_rank(str(tmp_path), 1)) == ["__1_0.distcp", "__1_1.distcp"]
    assert manifest.files_of_rank(str(tmp_path), 10) == ["__10_0.distcp"]
    assert manifest.files_of_rank(str(tmp_path), 2) == []


def test_the_manifest_document(monkeypatch):
    monkeypatch.setattr(manifest.time, "time", lambda: 1234.5)
    files = {"b": {"size": 1, "xxh3_64": "2"}, "a": {"size": 3, "xxh3_64": "4"}}
    doc = manifest.manifest_document(7, 4, files)
    assert doc == {
        "format": "torchtitan.checkpoint_manifest",
        "version": 1,
        "step": 7,
        "world_size": 4,
        "time": 1234.5,
        "checksum": "xxh3_64",
        "finite": True,
        "files": {"a": {"size": 3, "xxh3_64": "4"}, "b": {"size": 1, "xxh3_64": "2"}},
    }
    assert list(doc["files"]) == ["a", "b"]
    assert manifest.manifest_document(7, 4, {}, finite=False)["finite"] is False


# -- reading a step folder ------------------------------------------------------------------


def test_a_step_folder_is_named_step_n(tmp_path):
    assert manifest.folder_step(str(tmp_path / "step-12")) == 12
    assert manifest.folder_step(str(tmp_path / "step-12") + "/") == 12
    assert refusal(lambda: manifest.folder_step("/ck/step-x")) == (
        "/ck/step-x: not a step folder (expected a name step-N)"
    )


def test_unreadable_json_is_named(tmp_path):
    path = tmp_path / "doc.json"
    assert refusal(lambda: manifest._read_json(str(path))) == f"{path}: missing"
    path.write_text("{not json")
    assert refusal(lambda: manifest._read_json(str(path))).startswith(f"{path}: unreadable (")
    assert refusal(lambda: manifest._read_json(str(tmp_path))).startswith(
        f"{tmp_path}: unreadable ("
    )
    path.write_text('{"step": "é"}', encoding="utf-8")
    assert manifest._read_json(str(path)) == {"step": "é"}


def test_the_loader_states_step_zephon_or_hf_baseline():
    assert manifest.loader_state_step({"step": 5, "ranks": [{"steps": 9}]}, "p") == 5
    assert manifest.loader_state_step({"ranks": [{"steps": 7}, {"steps": 7}]}, "p") == 7
    for doc in (
        {"ranks": [{"steps": 7}, {"steps": 8}]},
        {"ranks": [{"steps": "7"}]},
        {"ranks": []},
        {"step": "5"},
        [{"step": 5}],
        {},
    ):
        assert refusal(lambda d=doc: manifest.loader_state_step(d, "/x/dataloader.json")) == (
            "/x/dataloader.json: no step recorded in the loader state"
        )


# -- verification ---------------------------------------------------------------------------


def test_a_good_step_verifies_fully_by_default(tmp_path):
    d = step_folder(tmp_path, 4)
    assert manifest.verify_step_dir(str(d)) == Verified(4, False)
    assert manifest.verify_step_dir(str(d), "size") == Verified(4, False)
    assert refusal(lambda: manifest.verify_step_dir(str(d), "fast")) == (
        "checkpoint.verify = 'fast': expected one of ('full', 'size')"
    )


def test_a_manifest_must_be_one_and_of_this_step(tmp_path):
    d = step_folder(tmp_path, 4)
    marker = d / COMPLETE_FILE
    for bad in ([4], {"files": {}}):
        marker.write_text(json.dumps(bad))
        assert refusal(lambda: manifest.verify_step_dir(str(d))) == (
            f"{marker}: not a checkpoint manifest"
        )
    marker.write_text(json.dumps({"step": 5, "files": {}}))
    assert refusal(lambda: manifest.verify_step_dir(str(d))) == (
        f"{marker}: records step 5, but the folder is step 4"
    )


def test_listed_files_must_be_there_at_their_size(tmp_path):
    d = step_folder(tmp_path, 4)
    (d / "extra.bin").write_bytes(b"x" * 39)
    assert refusal(lambda: manifest.verify_step_dir(str(d), "size")) == (
        f"{d / 'extra.bin'}: 39 bytes, the manifest says 40 (truncated or overwritten)"
    )
    (d / "extra.bin").unlink()
    assert refusal(lambda: manifest.verify_step_dir(str(d), "size")) == (
        f"{d / 'extra.bin'}: missing (listed in COMPLETE.json)"
    )


def test_full_verification_checksums_what_size_alone_misses(tmp_path):
    d = step_folder(tmp_path, 4)
    (d / "extra.bin").write_bytes(b"y" * 40)
    assert manifest.verify_step_dir(str(d), "size") == Verified(4, False)
    got = xxhash.xxh3_64(b"y" * 40).hexdigest()
    want = xxhash.xxh3_64(b"x" * 40).hexdigest()
    assert refusal(lambda: manifest.verify_step_dir(str(d), "full")) == (
        f"{d / 'extra.bin'}: checksum {got} differs from the manifest's {want} "
        "(the file's content changed after the save)"
    )


def test_the_manifest_names_its_checksum(tmp_path):
    d = step_folder(tmp_path, 4)
    doc = json.loads((d / COMPLETE_FILE).read_text())
    files = {n: {"size": e["size"], "other": e["xxh3_64"]} for n, e in doc["files"].items()}
    edit_manifest(d, checksum="other", files=files)
    assert manifest.verify_step_dir(str(d)) == Verified(4, False)
    doc = json.loads((d / COMPLETE_FILE).read_text())
    del doc["checksum"]  # an older manifest: xxh3_64
    doc["files"] = {n: {"size": e["size"], "xxh3_64": e["other"]} for n, e in files.items()}
    (d / COMPLETE_FILE).write_text(json.dumps(doc))
    assert manifest.verify_step_dir(str(d)) == Verified(4, False)


def test_shares_split_the_checksums_by_listed_order(tmp_path):
    d = step_folder(tmp_path, 4)  # listed: .metadata, __0_0.distcp, dataloader.json, extra.bin
    (d / "__0_0.distcp").write_bytes(b"rank 0 sharD")  # index 1
    assert manifest.verify_step_dir(str(d), "full", (0, 2)) == Verified(4, False)
    assert "__0_0.distcp: checksum" in refusal(
        lambda: manifest.verify_step_dir(str(d), "full", (1, 2))
    )
    assert manifest.verify_share(str(d), 0, 2) is None
    assert manifest.verify_share(str(d), 2, 4) is None
    assert manifest.verify_share(str(d), 1, 2).startswith(f"{d / '__0_0.distcp'}: checksum ")
    assert manifest.verify_share(str(d), 1, 4).startswith(f"{d / '__0_0.distcp'}: checksum ")


def test_other_ranks_shares_of_a_legacy_or_unreadable_step(tmp_path):
    d = step_folder(tmp_path, 4)
    (d / "__0_0.distcp").write_bytes(b"changed")
    (d / COMPLETE_FILE).write_text(json.dumps({"step": 4}))  # legacy: nothing to checksum
    assert manifest.verify_share(str(d), 1, 2) is None
    (d / COMPLETE_FILE).write_text("[]")
    assert manifest.verify_share(str(d), 1, 2) is None
    (d / COMPLETE_FILE).unlink()
    assert manifest.verify_share(str(d), 1, 2) == f"{d / COMPLETE_FILE}: missing"


def test_the_loader_state_must_be_of_the_folders_step(tmp_path):
    d = step_folder(tmp_path, 6, loader_step=2)
    assert refusal(lambda: manifest.verify_step_dir(str(d), "size")) == (
        f"{d / LOADER_FILE}: loader state of step 2 in the folder of step 6"
    )
    (d / LOADER_FILE).unlink()
    doc = json.loads((d / COMPLETE_FILE).read_text())
    del doc["files"][LOADER_FILE]  # not listed, still required beside a manifest
    (d / COMPLETE_FILE).write_text(json.dumps(doc))
    assert refusal(lambda: manifest.verify_step_dir(str(d), "size")) == (
        f"{d / LOADER_FILE}: missing"
    )


def test_a_legacy_step_is_checked_for_what_it_has(tmp_path):
    d = step_folder(tmp_path, 6)
    (d / COMPLETE_FILE).write_text(json.dumps({"step": 6}))
    assert manifest.verify_step_dir(str(d)) == Verified(6, True)
    (d / LOADER_FILE).write_text(json.dumps({"step": 5}))
    assert "loader state of step 5" in refusal(lambda: manifest.verify_step_dir(str(d)))
    (d / LOADER_FILE).unlink()
    assert manifest.verify_step_dir(str(d), "size") == Verified(6, True)


# -- which steps exist, which to keep -------------------------------------------------------


def test_step_folders_oldest_first_and_the_marked_ones(tmp_path):
    assert manifest.step_dirs(str(tmp_path / "nothing")) == []
    for name in ("step-10", "step-2", "step-x", "step-3", "other"):
        (tmp_path / name).mkdir()
    for name in ("step-10", "step-2"):
        (tmp_path / name / COMPLETE_FILE).write_text("{}")
    assert manifest.step_dirs(str(tmp_path)) == [2, 3, 10]
    assert manifest.marked_steps(str(tmp_path)) == [2, 10]


def test_a_step_is_finite_unless_its_manifest_says_false(tmp_path):
    for step, text in ((1, '{"finite": false}'), (2, '{"finite": true}'), (3, "{}"),
                       (4, "[false]"), (5, "not json"), (6, '{"finite": 0}')):  # fmt: skip
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / COMPLETE_FILE).write_text(text)
    assert [manifest.step_finite(str(tmp_path), s) for s in range(1, 8)] == [
        False, True, True, True, True, True, True,
    ]  # fmt: skip


def test_pruning_keeps_the_newest_k_candidates_and_the_two_newest_finite_steps(tmp_path):
    for step, finite in ((2, True), (4, True), (6, False), (8, True)):
        step_folder(tmp_path, step, finite=finite)
    folder = str(tmp_path)
    assert manifest.steps_to_prune(folder, 1) == [2, 6]  # 4 and 8: the two newest finite
    assert manifest.steps_to_prune(folder, 2) == [2]
    assert manifest.steps_to_prune(folder, 1, candidates=[4, 6, 8]) == [6]
    assert manifest.steps_to_prune(folder, 0) == manifest.steps_to_prune(folder, -1) == []
    edit_manifest(tmp_path / "step-8", finite=False)
    assert manifest.steps_to_prune(folder, 1) == [6]  # 2 and 4: the two newest finite


def test_the_newest_verified_step_below_a_bound(tmp_path):
    for step in (2, 4, 6):
        step_folder(tmp_path, step)
    (tmp_path / "step-6" / "extra.bin").write_bytes(b"")
    folder = str(tmp_path)
    assert manifest.newest_verified(folder, "size") == 4
    assert manifest.newest_verified(folder, "size", below=4) == 2
    assert manifest.newest_verified(folder, "size", below=5) == 4
    assert manifest.newest_verified(folder, "size", below=2) is None


# -- choosing the step to resume from -------------------------------------------------------


def test_resume_from_the_newest_step_or_the_one_asked_for(tmp_path, caplog):
    folder = str(tmp_path)
    assert manifest.select_resume_step(folder, -1, "full") is None
    for step in (0, 2, 4):
        step_folder(tmp_path, step)
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        assert manifest.select_resume_step(folder, -1, "full") == 4
    (record,) = caplog.records
    assert re.fullmatch(rf"verified {folder}/step-4 \(full\) in \d\.\d\ds", record.getMessage())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        assert manifest.select_resume_step(folder, 0, "size", (0, 2)) == 0
        assert manifest.select_resume_step(folder, 2, "size", (1, 2)) == 2
    assert not caplog.records  # a share of the checks: the caller reports
    assert refusal(lambda: manifest.select_resume_step(folder, 3, "full")) == (
        f"checkpoint.load_step = 3, but {folder} has no complete checkpoint for that step "
        "(complete: [0, 2, 4])"
    )
    assert refusal(lambda: manifest.select_resume_step(str(tmp_path / "none"), 3, "full")) == (
        f"checkpoint.load_step = 3, but {tmp_path / 'none'} has no complete checkpoint for that "
        "step (complete: none)"
    )


def test_a_step_that_fails_is_refused_pointing_at_an_older_one(tmp_path):
    for step in (0, 2, 4):
        step_folder(tmp_path, step)
    folder = str(tmp_path)
    for step in (4, 0):
        (tmp_path / f"step-{step}" / "extra.bin").write_bytes(b"")
    bad = f"{tmp_path / 'step-4' / 'extra.bin'}: 0 bytes, the manifest says 40 (truncated or overwritten)"
    assert refusal(lambda: manifest.select_resume_step(folder, -1, "size")) == (
        f"the latest checkpoint, step 4, fails verification: {bad}\n"
        "the newest step that verifies is 2: resume from it explicitly with "
        "--checkpoint.load_step 2"
    )
    assert refusal(lambda: manifest.select_resume_step(folder, 4, "size")) == (
        f"checkpoint.load_step = 4 fails verification: {bad}\n"
        "the newest step that verifies is 2: resume from it explicitly with "
        "--checkpoint.load_step 2"
    )
    assert refusal(lambda: manifest.select_resume_step(folder, 0, "size")) == (
        f"checkpoint.load_step = 0 fails verification: "
        f"{tmp_path / 'step-0' / 'extra.bin'}: 0 bytes, the manifest says 40 (truncated or "
        "overwritten)\nno older step verifies either"
    )


def test_a_legacy_step_resumes_with_a_warning(tmp_path, caplog):
    d = step_folder(tmp_path, 3)
    (d / COMPLETE_FILE).write_text(json.dumps({"step": 3}))
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        assert manifest.select_resume_step(str(tmp_path), -1, "full") == 3
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            f"{tmp_path}/step-3 was written before checkpoint manifests: its files cannot be "
            "verified (resuming anyway)",
        )
    ]


def test_the_loaded_model_step_must_be_the_folders(tmp_path):
    d = str(tmp_path / "step-5")
    assert manifest.check_loaded_step(d, 5) is None
    assert refusal(lambda: manifest.check_loaded_step(d, 4)) == (
        f"{d}: the model checkpoint holds train step 4, but the folder, manifest and loader "
        "state are step 5"
    )


def test_file_checksum_reads_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(manifest, "_CHUNK", 7)
    data = os.urandom(100)
    (tmp_path / "f").write_bytes(data)
    assert manifest.file_checksum(str(tmp_path / "f")) == xxhash.xxh3_64(data).hexdigest()


def test_manifests_are_read_as_utf8_whatever_the_locale(tmp_path, ascii_locale):
    path = tmp_path / "doc.json"
    path.write_text('{"step": 3, "note": "é"}', encoding="utf-8")
    assert manifest._read_json(str(path)) == {"step": 3, "note": "é"}
    (tmp_path / "step-3").mkdir()
    (tmp_path / "step-3" / COMPLETE_FILE).write_text('{"finite": false, "note": "é"}', "utf-8")
    assert manifest.step_finite(str(tmp_path), 3) is False


def test_no_finite_step_is_none_and_a_stepless_loader_state_is_named(tmp_path):
    for step in (2, 4):
        step_folder(tmp_path, step, finite=False)
    assert manifest.newest_finite(str(tmp_path)) is None
    d = tmp_path / "step-4"
    (d / LOADER_FILE).write_text("{}")
    edit_manifest(d, files={})
    assert refusal(lambda: manifest.verify_step_dir(str(d))) == (
        f"{d / LOADER_FILE}: no step recorded in the loader state"
    )
    assert refusal(lambda: manifest.loader_state_step({"ranks": 5}, "p")) == (
        "p: no step recorded in the loader state"
    )


def test_the_newest_verified_and_the_resume_step_check_what_they_are_asked(tmp_path):
    for step in (2, 4):
        step_folder(tmp_path, step)
    # Same size, other bytes: passes "size", fails "full".
    (tmp_path / "step-4" / ".metadata").write_bytes(b"dcp metadatA")
    folder = str(tmp_path)
    assert manifest.newest_verified(folder, "size") == 4
    assert manifest.newest_verified(folder, "full") == 2
    # Listed order: .metadata (0), __0_0.distcp (1), dataloader.json (2), extra.bin (3):
    # the rank with share (1, 2) checksums 1 and 3, not the changed .metadata.
    assert manifest.select_resume_step(folder, 4, "full", (1, 2)) == 4
    assert "fails verification" in refusal(lambda: manifest.select_resume_step(folder, 4, "full"))
