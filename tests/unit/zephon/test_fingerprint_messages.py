"""What a refused resume says when the checkpoint's data identity differs from this run's
(zephon/state/checkpoint_state.py): which source file changed (its index, path and what
differs), which remote object got another version, which phase's start step moved, and
for a state of an older Zephon, where its path-relative digests looked. Every message
is checked line by line, on hand-made fingerprints and states."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from zephon.errors import StateError
from zephon.recipe.phases import Phase, PhaseTimeline
from zephon.state import checkpoint_state as st

HEAD = (
    "cannot resume: settings that define the data changed since the checkpoint (resuming "
    "would silently train on different batches):"
)
TAIL = "Restore the original values, or start a new run without this checkpoint."


def refusal_lines(call: Any) -> list[str]:
    """The refused settings, one a line, between the message's fixed head and tail."""
    with pytest.raises(StateError) as info:
        call()
    head, *lines, tail = str(info.value).split("\n")
    assert (head, tail) == (HEAD, TAIL)
    assert all(line.startswith("  ") for line in lines)
    return [line[2:] for line in lines]


def plain(files: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    """A recipe without phases; with `files`: a version 3 state's, checked by content."""
    fp = {"seq_len": 16, "global_batch_size": 8, "lanes": 4, "seed": 1, "tokenizer": "t" * 64,
          "sources": {"prose": 5, "code": 3}, "recipe": "r" * 64, **kw}  # fmt: skip
    return fp if files is None else {**fp, "files": files}


def files(**changes: Any) -> dict[str, Any]:
    """Content fingerprints ([size, [block hashes]]) of two sources' files."""
    out = {"prose": [[3000, ["h30"]], [500, ["h5"]]], "code": [[2000, ["h20"]]]}
    return {**out, **changes}


PATHS = {"prose": ["/data/p0.jsonl", "/data/p1.jsonl"], "code": ["/data/c.jsonl"]}


# -- files, by content ----------------------------------------------------------------------


def test_a_file_of_another_size_is_named_by_source_index_and_path():
    saved = plain(files())
    st.check_fingerprint(saved, plain(files()), files=PATHS)
    current = plain(files(prose=[[3000, ["h30"]], [501, ["h5"]]]))
    assert refusal_lines(lambda: st.check_fingerprint(saved, current, files=PATHS)) == [
        "source 'prose': file 2 of 2, /data/p1.jsonl: size: checkpoint has 500 bytes, this "
        "run has 501",
    ]


def test_same_size_other_bytes_names_the_block_that_differs():
    saved = plain(files())
    current = plain(files(prose=[[3000, ["h31"]], [500, ["h5"]]], code=[[2000, ["h21"]]]))
    assert refusal_lines(lambda: st.check_fingerprint(saved, current, files=PATHS)) == [
        "source 'code': file 1 of 1, /data/c.jsonl: content fingerprint of bytes 0..1999 "
        "(same size, 2000 bytes): checkpoint has h20, this run has h21",
        "source 'prose': file 1 of 2, /data/p0.jsonl: content fingerprint of bytes 0..2999 "
        "(same size, 3000 bytes): checkpoint has h30, this run has h31",
    ]


def test_a_file_whose_path_is_not_known_is_named_by_its_index_alone():
    saved = plain(files())
    current = plain(files(prose=[[3000, ["h30"]], [501, ["h5"]]]))
    unnamed = "source 'prose': file 2 of 2: size: checkpoint has 500 bytes, this run has 501"
    assert refusal_lines(lambda: st.check_fingerprint(saved, current)) == [unnamed]
    for names in ({"code": ["/data/c.jsonl"]}, {"prose": []}, {"prose": ["/data/p0.jsonl"]}):
        assert refusal_lines(lambda n=names: st.check_fingerprint(saved, current, files=n)) == [
            unnamed
        ]


def test_another_number_of_files_is_named_and_the_next_source_still_checked():
    saved = plain(files())
    current = plain(
        files(code=[[2000, ["h20"]], [10, ["h1"]]], prose=[[3000, ["h30"]], [500, ["h6"]]])
    )
    assert refusal_lines(lambda: st.check_fingerprint(saved, current, files=PATHS)) == [
        "source 'code': checkpoint has 1 file(s), this run has 2",
        "source 'prose': file 2 of 2, /data/p1.jsonl: content fingerprint of bytes 0..499 "
        "(same size, 500 bytes): checkpoint has h5, this run has h6",
    ]


def test_a_source_in_one_run_only_is_left_to_its_sources_field():
    saved = plain(files(aside=[[7, ["h7"]]]), sources={"aside": 2, "prose": 5, "code": 3})
    current = plain(files(prose=[[3000, ["h30"]], [500, ["h6"]]]))
    # "aside" sorts first and has no files in this run: skipped, the others still checked.
    assert refusal_lines(lambda: st.check_fingerprint(saved, current)) == [
        "sources: checkpoint has {'aside': 2, 'prose': 5, 'code': 3}, this run has "
        "{'prose': 5, 'code': 3}",
        "source 'prose': file 2 of 2: content fingerprint of bytes 0..499 (same size, 500 "
        "bytes): checkpoint has h5, this run has h6",
    ]
    assert refusal_lines(lambda: st.check_fingerprint(current, saved)) == [
        "sources: checkpoint has {'prose': 5, 'code': 3}, this run has "
        "{'aside': 2, 'prose': 5, 'code': 3}",
        "source 'prose': file 2 of 2: content fingerprint of bytes 0..499 (same size, 500 "
        "bytes): checkpoint has h6, this run has h5",
    ]


def ph(name: str, start: int, weights: dict[str, float]) -> dict[str, Any]:
    return {"name": name, "start_step": start, "seq_len": 16, "global_batch_size": 8,
            "lanes": 4, "weights": weights, "sources": {n: 5 for n in weights},
            "recipe": "r" * 64}  # fmt: skip


def test_only_the_files_of_sources_the_started_phases_used_are_checked():
    saved = {"seed": 1, "phases": [ph("warm", 0, {"prose": 1.0})], "files": files()}
    later = [ph("warm", 0, {"prose": 1.0}), ph("code", 9, {"code": 1.0})]
    changed_code = {"seed": 1, "phases": later, "files": files(code=[[2000, ["h29"]]])}
    st.check_fingerprint(saved, changed_code, 4)  # no batch of "code" was drawn yet
    changed_prose = {**changed_code, "files": files(prose=[[3000, ["h39"]], [500, ["h5"]]])}
    assert refusal_lines(lambda: st.check_fingerprint(saved, changed_prose, 4, files=PATHS)) == [
        "source 'prose': file 1 of 2, /data/p0.jsonl: content fingerprint of bytes 0..2999 "
        "(same size, 3000 bytes): checkpoint has h30, this run has h39",
    ]


# -- remote objects -------------------------------------------------------------------------


def test_a_remote_object_reached_by_the_same_url_must_keep_its_version():
    saved = plain(files(), remote={"s3://b/a": "e1", "s3://b/c": "e3", "s3://b/gone": "e9"})
    moved = plain(files(), remote={"s3://b/a": "e1", "s3://b/c": "e3", "s3://m/new": "e0"})
    st.check_fingerprint(saved, moved)  # other URLs: the files' content decides
    st.check_fingerprint(saved, plain(files()))  # the same data, now local
    changed = plain(files(), remote={"s3://b/a": "e2", "s3://b/c": "e3", "s3://m/new": "e0"})
    assert refusal_lines(lambda: st.check_fingerprint(saved, changed)) == [
        "remote: checkpoint has {'s3://b/a': 'e1'}, this run has {'s3://b/a': 'e2'}",
    ]


# -- states of an older Zephon: digests over relative paths ---------------------------------


LEGACY_NOTE = (
    "this checkpoint was written by an older Zephon (loader state version 2 or older), whose "
    "recipe digests include each source's paths relative to the recipe folder ({}): a copied "
    "recipe or moved data changes them. Resume once with the recipe and its data where they "
    "were relative to each other; checkpoints written after that identify the data by "
    "content, wherever it is."
)


def test_a_legacy_recipe_digest_that_differs_says_where_its_paths_were():
    relative = {"prose": ["a.jsonl", "sub/b.jsonl"], "code": ["c.jsonl"]}
    current = plain(recipe="s" * 64, relative_paths=relative)
    assert refusal_lines(lambda: st.check_fingerprint(plain(), current)) == [
        f"recipe: checkpoint has {'r' * 12}…, this run has {'s' * 12}…",
        LEGACY_NOTE.format("prose: a.jsonl, sub/b.jsonl; code: c.jsonl"),
    ]
    assert refusal_lines(lambda: st.check_fingerprint(plain(), plain(recipe="s" * 64))) == [
        f"recipe: checkpoint has {'r' * 12}…, this run has {'s' * 12}…",
        LEGACY_NOTE.format("see the recipe"),
    ]


def test_the_legacy_note_comes_only_with_a_changed_recipe_digest():
    assert refusal_lines(lambda: st.check_fingerprint(plain(), plain(seed=2))) == [
        "seed: checkpoint has 1, this run has 2",
    ]
    # A version 3 state's digests hold no paths: nothing to explain.
    assert refusal_lines(lambda: st.check_fingerprint(plain(files()), plain(files(), recipe="s"))) == [
        f"recipe: checkpoint has {'r' * 12}…, this run has s…",
    ]  # fmt: skip


# -- a phase whose start step moved ---------------------------------------------------------


def by_content(*phases: dict[str, Any]) -> dict[str, Any]:
    return {"seed": 1, "phases": list(phases), "files": files()}


def test_a_phase_moved_before_the_checkpoints_step_says_from_where_to_where():
    saved = by_content(ph("warm", 0, {"prose": 1.0}))
    current = by_content(ph("warm", 0, {"prose": 1.0}), ph("code", 2, {"code": 1.0}))
    assert refusal_lines(
        lambda: st.check_fingerprint(saved, current, 6, [["code", 8], ["anneal", 12]])
    ) == [
        "phase 'code' starts at step 2, before the checkpoint's step 6, but the checkpoint's "
        "run had it start at step 8: its start step moved from 8 to 2, which a resume past "
        "step 2 cannot accept (the checkpoint's batches after it were not the phase's); start "
        "it at step 6 or later",
    ]
    assert refusal_lines(lambda: st.check_fingerprint(saved, current, 6, [["anneal", 12]])) == [
        "phase 'code' starts at step 2, before the checkpoint's step 6, but the checkpoint's "
        "run had no such phase",
    ]
    st.check_fingerprint(saved, current, 2, [["code", 8]])  # not started by step 2: free


# -- from a state document ------------------------------------------------------------------


def reader_of(name: str, urls: list[str]) -> Any:
    return SimpleNamespace(
        spec=SimpleNamespace(name=name),
        content_files=lambda: [SimpleNamespace(url=u) for u in urls],
    )


def test_a_state_is_checked_at_its_step_with_its_later_phases_and_file_paths():
    saved = by_content(ph("warm", 0, {"prose": 1.0, "code": 1.0}))
    state = {"step": "6", "fingerprint": saved, "later_phases": [["code", 8]]}
    current = {
        **by_content(ph("warm", 0, {"prose": 1.0, "code": 1.0}), ph("code", 2, {"code": 1.0})),
        "files": files(code=[[2001, ["h20"]]]),
    }
    readers = [reader_of("prose", PATHS["prose"]), reader_of("code", ["s3://b/c.jsonl"])]
    assert refusal_lines(
        lambda: st.check_state_data(state, current, None, readers, None, None)
    ) == [
        "source 'code': file 1 of 1, s3://b/c.jsonl: size: checkpoint has 2000 bytes, this run "
        "has 2001",
        "phase 'code' starts at step 2, before the checkpoint's step 6, but the checkpoint's "
        "run had it start at step 8: its start step moved from 8 to 2, which a resume past "
        "step 2 cannot accept (the checkpoint's batches after it were not the phase's); start "
        "it at step 6 or later",
    ]
    same_files = {**current, "files": files()}  # and phase "code" not started by step 2:
    st.check_state_data({**state, "step": 2}, same_files, None, readers, None, None)


# -- building a legacy fingerprint, reading a version 1 state -------------------------------


class LegacyRecipe:
    seed, lanes = 7, 4
    sources = [SimpleNamespace(name="prose", multimodal=False),
               SimpleNamespace(name="code", multimodal=False)]  # fmt: skip

    def digest(self, paths: bool = False) -> str:
        return "digest-with-paths" if paths else "digest"

    def data_identity(self, paths: bool = False) -> dict[str, Any]:
        return {"sources": [{"name": s.name, "paths": [f"{s.name}.jsonl"]} for s in self.sources]}


def test_a_legacy_fingerprint_also_needs_a_reader_for_every_source():
    reader = SimpleNamespace(num_docs=3, remote_versions=dict, content_fingerprints=list)
    tok = SimpleNamespace(fingerprint="tok", choices=None)
    timeline = PhaseTimeline((Phase(None, 0, None, 8, 16, 4, (0.5, 0.5), ("prose", "code")),),
                             named=False)  # fmt: skip
    fp = st.make_fingerprint(LegacyRecipe(), [reader, reader], tok, timeline, legacy=True)
    assert (fp["sources"], fp["recipe"]) == ({"prose": 3, "code": 3}, "digest-with-paths")
    with pytest.raises(ValueError):
        st.make_fingerprint(LegacyRecipe(), [reader], tok, timeline, legacy=True)
