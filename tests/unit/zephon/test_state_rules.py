"""The loader state document and its checks, field by field and word for word
(zephon/state/checkpoint_state.py), on hand-made fingerprints, schedules and states."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any

import pytest

from zephon.errors import StateError
from zephon.images.pixels import canary
from zephon.recipe.phases import Phase, PhaseTimeline
from zephon.schema.recipe import ImageSpec
from zephon.state import checkpoint_state as st

NAMES = ("prose", "code")


def phase(name: str | None, start: int, end: int | None, **kw: Any) -> Phase:
    kw = {"gbs": 8, "seq": 16, "lanes": 4, "weights": (0.7, 0.3), **kw}
    return Phase(name, start, end, kw["gbs"], kw["seq"], kw["lanes"], kw["weights"], NAMES)


def named_schedule() -> PhaseTimeline:
    """Built in each test, not at import: the code under test runs inside the test."""
    return PhaseTimeline(
        (
            phase("warm", 0, 3),
            phase("ramp", 3, 5, gbs=16),
            phase("anneal", 5, None, lanes=8, weights=(0.0, 1.0)),
        ),
        named=True,
    )


def plain_schedule() -> PhaseTimeline:
    return PhaseTimeline((phase(None, 0, None),), named=False)


def refused(call: Any) -> str:
    with pytest.raises(StateError) as info:
        call()
    return str(info.value)


# -- what a rank writes ---------------------------------------------------------------------


class FakeRecipe:
    seed, lanes, image = 7, 4, ImageSpec()

    def __init__(self, multimodal: bool = False) -> None:
        self.sources = [
            SimpleNamespace(name="prose", multimodal=False),
            SimpleNamespace(name="code", multimodal=multimodal),
        ]

    def digest(self, paths: bool = False) -> str:
        return "recipe-digest-with-paths" if paths else "recipe-digest"

    def data_identity(
        self,
        lanes: int | None = None,
        weights: dict[str, float] | None = None,
        paths: bool = False,
    ) -> dict[str, Any]:
        out = {"lanes": lanes, "weights": weights}
        if paths:  # the source paths relative to the recipe folder, as version 2 had them
            return {
                **out,
                "sources": [{"name": s.name, "paths": ["a.jsonl"]} for s in self.sources],
            }
        return out  # fmt: skip


def reader(n: int, remote: dict[str, str] | None = None) -> Any:
    files = [[n * 100, [f"h{n}"]]]  # a source file's content fingerprint: size, block hashes
    return SimpleNamespace(
        num_docs=n, remote_versions=lambda: dict(remote or {}), content_fingerprints=lambda: files
    )


FILES = {"prose": [[3000, ["h30"]]], "code": [[2000, ["h20"]]]}


TOK = SimpleNamespace(fingerprint="tok-fp", choices=None)


def identity(lanes: int, weights: dict[str, float]) -> str:
    blob = json.dumps({"lanes": lanes, "weights": weights}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def test_a_recipe_without_phases_keeps_its_original_fingerprint_fields():
    fp = st.make_fingerprint(FakeRecipe(), [reader(30), reader(20)], TOK, plain_schedule())
    assert fp == {
        "tokenizer": "tok-fp",
        "seed": 7,
        "recipe": "recipe-digest",
        "sources": {"prose": 30, "code": 20},
        "seq_len": 16,
        "global_batch_size": 8,
        "lanes": 4,
        "files": FILES,
    }
    # what a version 2 state of the same run recorded: digests over relative paths
    legacy = st.make_fingerprint(
        FakeRecipe(), [reader(30), reader(20)], TOK, plain_schedule(), legacy=True
    )
    assert legacy["recipe"] == "recipe-digest-with-paths" and "files" not in legacy
    assert legacy["relative_paths"] == {"prose": ["a.jsonl"], "code": ["a.jsonl"]}


def test_a_recipe_with_phases_records_each_phase():
    fp = st.make_fingerprint(FakeRecipe(), [reader(30), reader(20)], TOK, named_schedule())
    both, code = {"prose": 0.7, "code": 0.3}, {"code": 1.0}
    assert fp == {
        "tokenizer": "tok-fp",
        "seed": 7,
        "phases": [
            {"name": "warm", "start_step": 0, "seq_len": 16, "global_batch_size": 8,
             "lanes": 4, "weights": both, "sources": {"prose": 30, "code": 20},
             "recipe": identity(4, both)},
            {"name": "ramp", "start_step": 3, "seq_len": 16, "global_batch_size": 16,
             "lanes": 4, "weights": both, "sources": {"prose": 30, "code": 20},
             "recipe": identity(4, both)},
            {"name": "anneal", "start_step": 5, "seq_len": 16, "global_batch_size": 8,
             "lanes": 8, "weights": code, "sources": {"code": 20},
             "recipe": identity(8, code)},
        ],
        "files": FILES,
    }  # fmt: skip


def test_special_tokens_remote_files_and_images_add_their_fields(monkeypatch):
    monkeypatch.setattr(canary, "decode_canary", lambda spec: {"of": spec})
    tok = SimpleNamespace(fingerprint="tok-fp", choices={"eos": "<e>"})
    readers = [reader(30, {"s3://b/a": "etag-a"}), reader(20, {"s3://b/c": "etag-c"})]
    fp = st.make_fingerprint(FakeRecipe(multimodal=True), readers, tok, plain_schedule())
    assert fp["tokenizer_choices"] == {"eos": "<e>"}
    assert fp["remote"] == {"s3://b/a": "etag-a", "s3://b/c": "etag-c"}
    assert fp["decode_canary"] == {"of": ImageSpec()} and "image.decode" not in fp
    plain = st.make_fingerprint(FakeRecipe(), [reader(30), reader(20)], TOK, plain_schedule())
    assert not {"tokenizer_choices", "remote", "decode_canary"} & set(plain)
    reduced = FakeRecipe(multimodal=True)
    reduced.image = ImageSpec(decode="reduced")
    fp = st.make_fingerprint(reduced, readers, tok, plain_schedule())
    assert fp["image.decode"] == "reduced"


def test_every_source_needs_its_reader():
    with pytest.raises(ValueError):
        st.make_fingerprint(FakeRecipe(), [reader(30)], TOK, plain_schedule())


def test_a_state_records_only_the_phases_started_by_its_step():
    fp = st.make_fingerprint(FakeRecipe(), [reader(30), reader(20)], TOK, named_schedule())
    assert [p["name"] for p in st.fingerprint_at(fp, 3)["phases"]] == ["warm"]
    assert [p["name"] for p in st.fingerprint_at(fp, 4)["phases"]] == ["warm", "ramp"]
    assert st.fingerprint_at(fp, 3)["seed"] == 7
    plain = {"seed": 1, "lanes": 4}
    assert st.fingerprint_at(plain, 3) is plain


def test_a_ranks_state_document():
    fp = {
        "seed": 1,
        "phases": [{"name": "warm", "start_step": 0}, {"name": "ramp", "start_step": 3}],
    }
    lanes = {"0": {"flush": {"row": 0}, "rows_since_flush": 2}}
    segment = named_schedule().segment_of(3)
    assert st.rank_state(fp, named_schedule(), 3, 1, segment, lanes) == {
        "format": "zephon.loader_state",
        "version": 3,
        "fingerprint": {"seed": 1, "phases": [{"name": "warm", "start_step": 0}]},
        "step": 3,
        "rows_per_lane_per_step": 2,
        "rank": 1,
        "segment_start": 0,
        "num_lanes": 4,
        "lanes": lanes,
        "phase": "warm",
        "boundary_of": "ramp",
        "later_phases": [["ramp", 3], ["anneal", 5]],  # to name a moved boundary as moved
    }
    later = st.rank_state(fp, named_schedule(), 6, 0, named_schedule().segment_of(6), lanes)
    assert (later["phase"], later["rows_per_lane_per_step"], later["num_lanes"]) == ("anneal", 1, 8)
    assert later["segment_start"] == 5 and "boundary_of" not in later
    assert "boundary_of" not in st.rank_state(
        fp, named_schedule(), 0, 0, named_schedule().segment_of(0), lanes
    )
    plain = st.rank_state({"seed": 1}, plain_schedule(), 3, 0, plain_schedule().segments[0], lanes)
    assert "phase" not in plain and "boundary_of" not in plain


def test_phases_of_a_fingerprint_and_those_started():
    plain = {"seq_len": 16, "global_batch_size": 8, "lanes": 4, "sources": {"a": 1},
             "recipe": "r", "seed": 3}  # fmt: skip
    assert st.phases_of(plain) == [
        {"name": None, "start_step": 0, "seq_len": 16, "global_batch_size": 8, "lanes": 4,
         "sources": {"a": 1}, "recipe": "r"},
    ]  # fmt: skip
    named = {"phases": [{"name": "a", "start_step": 0}, {"name": "b", "start_step": "4"}]}
    assert st.phases_of(named) == named["phases"] and st.phases_of(named) is not named["phases"]
    assert st.started_phases({"step": 6, "fingerprint": named}) == [("a", 0), ("b", 4)]
    assert st.started_phases({"step": 0, "fingerprint": named}) == []
    assert st.started_phases({"step": 1, "fingerprint": plain}) == [(None, 0)]
    assert st.boundary_of({"boundary_of": "b"}) == "b" and st.boundary_of({}) is None


def test_dumps_is_sorted_with_indent_one():
    assert st.dumps({"b": [1], "a": {"d": 2, "c": 3}}) == (
        '{\n "a": {\n  "c": 3,\n  "d": 2\n },\n "b": [\n  1\n ]\n}'
    )


# -- reading and checking a state -----------------------------------------------------------

HEADER = {"format": "zephon.loader_state", "version": 2, "fingerprint": {}, "step": 0, "lanes": {}}


def test_headers_are_checked_naming_the_origin():
    st.check_header(HEADER)
    st.check_header({**HEADER, "version": 1})
    assert refused(lambda: st.check_header([HEADER])) == (
        "loader state: not a Zephon loader state (expected format 'zephon.loader_state')"
    )
    assert refused(lambda: st.check_header({**HEADER, "format": "x"}, "f.json")) == (
        "f.json: not a Zephon loader state (expected format 'zephon.loader_state')"
    )
    assert refused(lambda: st.check_header({**HEADER, "version": "2"}, "f.json")) == (
        "f.json: state version '2'; this Zephon reads versions 1, 2, 3"
    )
    for key in ("fingerprint", "step", "lanes"):
        bad = {k: v for k, v in HEADER.items() if k != key}
        assert (
            refused(lambda b=bad: st.check_header(b, "f.json")) == f"f.json: missing field {key!r}"
        )


def test_load_file_names_what_is_wrong(tmp_path):
    path = tmp_path / "s.json"
    assert refused(lambda: st.load_file(str(path))) == f"{path}: loader state file not found"
    assert refused(lambda: st.load_file(str(tmp_path))) == (
        f"{tmp_path}: cannot read the loader state: Is a directory"
    )
    path.write_bytes(b'{"a": "\xff"}')
    assert refused(lambda: st.load_file(str(path))).startswith(f"{path}: not valid JSON: ")
    path.write_text("{oops")
    assert refused(lambda: st.load_file(str(path))) == (
        f"{path}: not valid JSON: Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)"
    )
    path.write_text(json.dumps({**HEADER, "version": 9}))
    assert refused(lambda: st.load_file(str(path))) == (
        f"{path}: state version 9; this Zephon reads versions 1, 2, 3"
    )
    path.write_text(json.dumps({**HEADER, "note": "é"}), encoding="utf-8")
    assert st.load_file(str(path))["note"] == "é"


FP = {"seq_len": 16, "global_batch_size": 8, "lanes": 4, "seed": 1, "tokenizer": "t" * 64,
      "sources": {"a": 5}, "recipe": "r" * 64}  # fmt: skip


def test_a_changed_setting_is_named_with_both_values_in_field_order():
    st.check_fingerprint(FP, dict(FP))
    current = {**FP, "recipe": "s" * 64, "seed": 2, "tokenizer": None, "remote": {"u": "e"}}
    message = refused(lambda: st.check_fingerprint(FP, current))
    assert message.startswith(
        "cannot resume: settings that define the data changed since the checkpoint (resuming "
        "would silently train on different batches):\n"
        "  seed: checkpoint has 1, this run has 2\n"
        f"  tokenizer: checkpoint has {'t' * 12}…, this run has None\n"
        "  remote: checkpoint has None, this run has {'u': 'e'}\n"
        f"  recipe: checkpoint has {'r' * 12}…, this run has {'s' * 12}…\n"
    )
    assert message.endswith(
        "Restore the original values, or start a new run without this checkpoint."
    )
    # FP has no `files`: a state of version 2 or older, whose digests hold the paths
    assert "written by an older Zephon (loader state version 2 or older)" in message


def test_a_canary_that_differs_is_refused_first():
    here = {"version": 2, "digest": "b" * 64, "decoders": {}}
    saved = {"version": 1, "digest": "a" * 64, "decoders": {}}
    message = refused(
        lambda: st.check_fingerprint({**FP, "decode_canary": saved}, {**FP, "seed": 9,
                                                                      "decode_canary": here})
    )  # fmt: skip
    assert message == f"cannot resume: {canary.canary_mismatch(saved, here)}"
    assert "version 1 in the checkpoint, 2 here" in message
    st.check_fingerprint({**FP, "decode_canary": saved}, {**FP, "decode_canary": dict(saved)})
    st.check_fingerprint({**FP, "decode_canary": saved}, FP)  # one side without: not compared


def ph(name: str | None, start: int, **kw: Any) -> dict[str, Any]:
    return {"name": name, "start_step": start, "seq_len": 16, "global_batch_size": 8,
            "lanes": 4, "weights": {"a": 1.0}, "sources": {"a": 5}, "recipe": "r" * 64, **kw}  # fmt: skip


def phase_refusal(saved: list[dict], current: list[dict], step: int | None) -> list[str]:
    message = refused(
        lambda: st.check_fingerprint({"seed": 1, "phases": saved}, {"seed": 1, "phases": current},
                                     step)
    )  # fmt: skip
    head, *lines, tail = message.split("\n")
    assert head.startswith("cannot resume: settings that define the data changed")
    assert tail == "Restore the original values, or start a new run without this checkpoint."
    # These states have no `files` (version 2 or older): the refusal ends with a note
    # on their path-relative digests, not a refused setting of its own.
    lines = [ln for ln in lines if "written by an older Zephon" not in ln]
    return [line.strip() for line in lines]


def test_started_phases_must_match_and_later_ones_are_free():
    saved = [ph("a", 0), ph("b", 4)]
    st.check_fingerprint({"seed": 1, "phases": saved},
                         {"seed": 1, "phases": [*saved, ph("c", 9, lanes=8)]}, 6)  # fmt: skip
    st.check_fingerprint(
        {"seed": 1, "phases": saved}, {"seed": 1, "phases": saved + [ph("c", 6)]}, 6
    )
    assert phase_refusal(saved, [ph("a", 0), ph("b", 4, lanes=8, seq_len=32)], 6) == [
        "phase 'b': seq_len: checkpoint has 16, this run has 32",
        "phase 'b': lanes: checkpoint has 4, this run has 8",
    ]
    # Only when nothing else differs is the recipe digest named.
    assert phase_refusal(saved, [ph("a", 0, recipe="s" * 64), ph("b", 4)], 6) == [
        f"phase 'a': recipe: checkpoint has {'r' * 12}…, this run has {'s' * 12}…",
    ]


def test_a_renamed_phase_is_matched_by_its_start_step():
    saved = [ph("a", 0), ph("b", 4)]
    assert phase_refusal(saved, [ph("a", 0), ph("c", 4, lanes=2)], 6) == [
        "phase 'b': name: checkpoint has b, this run has c",
        "phase 'b': lanes: checkpoint has 4, this run has 2",
    ]


def test_phases_started_on_one_side_only():
    saved = [ph("a", 0), ph("b", 4)]
    assert phase_refusal(saved, [ph("a", 0), ph("b", 7)], 6) == [
        "phase 'b' (from step 4) had started by the checkpoint's step 6; its start step moved "
        "from 4 to 7",
    ]
    assert phase_refusal([ph("a", 0)], [ph("a", 0), ph("x", 2)], 6) == [
        "phase 'x' starts at step 2, before the checkpoint's step 6, but the checkpoint's run had "
        "not started it by then (it had no such phase, or started it later: a moved start step "
        "cannot be accepted once a resume is past it)",
    ]
    # Without a step, this run's first phases are compared one for one.
    assert phase_refusal(saved, [ph("a", 0), ph("x", 4, lanes=2), ph("b", 5)], None) == [
        "phase 'b': name: checkpoint has b, this run has x",
        "phase 'b': lanes: checkpoint has 4, this run has 2",
    ]


def test_a_recipe_without_phases_is_one_phase_from_step_0():
    plain = {"seed": 1, "seq_len": 16, "global_batch_size": 8, "lanes": 4, "sources": {"a": 5},
             "recipe": "r" * 64}  # fmt: skip
    named = {"seed": 1, "phases": [{**ph("first", 0), "weights": {"a": 1.0}}]}
    st.check_fingerprint(plain, named, 3)  # phases added to a running job's recipe
    assert (
        refused(
            lambda: st.check_fingerprint(plain, {"seed": 1, "phases": [ph("first", 0, lanes=8)]}, 3)
        ).split("\n")[1]
        == "  phase '(the recipe's only phase)': lanes: checkpoint has 4, this run has 8"
    )
    assert refused(lambda: st.check_fingerprint(plain, {**plain, "seed": 2}, 3)).split("\n")[1] == (
        "  seed: checkpoint has 1, this run has 2"
    )


# -- merging ranks, reading version 1 -------------------------------------------------------


def rank(r: int, lanes: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {**HEADER, "fingerprint": {"lanes": 3}, "step": 4, "rank": r, "lanes": lanes, **kw}


def test_rank_states_merge_into_one_covering_every_lane_in_order():
    merged = st.merge_rank_states([rank(1, {"2": "c"}), rank(0, {"1": "b", "0": "a"})])
    assert merged == {
        "format": "zephon.loader_state", "version": 2, "fingerprint": {"lanes": 3}, "step": 4,
        "lanes": {"0": "a", "1": "b", "2": "c"}, "dp_size": 2,
    }  # fmt: skip
    assert list(merged["lanes"]) == ["0", "1", "2"]
    two = st.merge_rank_states([rank(0, {"0": "a"}, num_lanes=2), rank(1, {"1": "b"}, num_lanes=2)])
    assert two["lanes"] == {"0": "a", "1": "b"} and two["num_lanes"] == 2


def test_dropped_records_are_the_union_of_the_ranks():
    merged = st.merge_rank_states(
        [
            rank(0, {"0": "a"}, dropped_records={"p": [5, 1], "q": [2]}),
            rank(1, {"1": "b"}),
            rank(2, {"2": "c"}, dropped_records={"p": [1, 3]}),
        ]
    )
    assert merged["dropped_records"] == {"p": [1, 3, 5], "q": [2]}
    assert list(merged["dropped_records"]) == ["p", "q"]
    assert "dropped_records" not in st.merge_rank_states([rank(0, {"0": 1, "1": 2, "2": 3})])


def test_merging_refuses_what_does_not_fit():
    assert refused(lambda: st.merge_rank_states([])) == "no rank states to merge"
    assert refused(lambda: st.merge_rank_states([rank(0, {"0": 1}), {"format": "x"}])) == (
        "loader state: not a Zephon loader state (expected format 'zephon.loader_state')"
    )
    for other in (rank(1, {"1": 2, "2": 3}, step=5), rank(1, {"1": 2, "2": 3}, fingerprint={})):
        assert refused(lambda o=other: st.merge_rank_states([rank(0, {"0": 1}), o])) == (
            "rank states disagree on fingerprint or step; ranks are out of sync"
        )
    assert refused(lambda: st.merge_rank_states([rank(0, {"0": 1}), rank(1, {"2": 3})])) == (
        "rank states cover lanes ['0', '2'], expected all 3"
    )


def test_a_version_1_state_reads_as_the_current_version():
    v1 = {**HEADER, "version": 1, "fingerprint": {"lanes": 2}, "extra": "kept",
          "lanes": {"0": {"flush": {"row": 3, "mix": [4, 5]}, "rows_since_flush": 1},
                    "1": {"flush": {"row": 0, "mix": [0, 1]}, "rows_since_flush": 4}}}  # fmt: skip
    up = st.upgrade(v1, ["prose", "code"])
    assert up == {
        **HEADER, "version": st.STATE_VERSION, "fingerprint": {"lanes": 2}, "extra": "kept",
        "segment_start": 0, "num_lanes": 2,
        "lanes": {"0": {"flush": {"row": 3, "mix": {"prose": 4, "code": 5}}, "rows_since_flush": 1},
                  "1": {"flush": {"row": 0, "mix": {"prose": 0, "code": 1}},
                        "rows_since_flush": 4}},
    }  # fmt: skip
    assert v1["lanes"]["0"]["flush"]["mix"] == [4, 5]  # the input is left as it was
    kept = {**v1, "segment_start": 6, "num_lanes": 8}
    assert (st.upgrade(kept, NAMES)["segment_start"], st.upgrade(kept, NAMES)["num_lanes"]) == (
        6,
        8,
    )
    v2 = {**HEADER, "lanes": {"0": {"flush": {"mix": [1]}}}}
    assert st.upgrade(v2, NAMES) == {**v2, "version": st.STATE_VERSION}  # nothing else moves
    v3 = {**v2, "version": 3}
    assert st.upgrade(v3, NAMES) is v3
    assert refused(lambda: st.upgrade(v1, ["prose", "code", "math"])) == (
        "loader state: lane 0 has 2 mixer counts, the recipe's first phase mixes 3 sources "
        "(prose, code, math)"
    )


def test_a_loader_state_is_read_as_utf8_whatever_the_locale(tmp_path, ascii_locale):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**HEADER, "note": "é"}, ensure_ascii=False), encoding="utf-8")
    assert st.load_file(str(path))["note"] == "é"


def test_every_started_phase_is_compared_after_one_that_is_missing():
    saved = [ph("a", 0), ph("b", 2), ph("c", 4, lanes=8)]
    assert phase_refusal(saved, [ph("a", 0), ph("c", 4)], 6) == [
        "phase 'b' (from step 2) had started by the checkpoint's step 6; this run's recipe does "
        "not start it by then",
        "phase 'c': lanes: checkpoint has 8, this run has 4",
    ]


def test_global_and_phase_changes_are_named_together():
    saved = {"seed": 1, "phases": [ph("a", 0)]}
    current = {"seed": 2, "phases": [ph("a", 0, lanes=8)]}
    assert refused(lambda: st.check_fingerprint(saved, current, 3)).split("\n")[1:3] == [
        "  seed: checkpoint has 1, this run has 2",
        "  phase 'a': lanes: checkpoint has 4, this run has 8",
    ]


def test_a_state_written_at_step_1_is_the_boundary_of_a_phase_starting_there():
    sched = PhaseTimeline((phase("a", 0, 1), phase("b", 1, None, gbs=16)), named=True)
    state = st.rank_state({"seed": 1}, sched, 1, 0, sched.segment_of(0), {})
    assert (state["phase"], state["boundary_of"]) == ("a", "b")


def test_the_recipe_digest_is_named_only_when_nothing_else_differs():
    saved = [ph("a", 0)]
    assert phase_refusal(saved, [ph("a", 0, lanes=2, recipe="s" * 64)], 3) == [
        "phase 'a': lanes: checkpoint has 4, this run has 2",
    ]


def test_phases_removed_from_a_recipe_compare_as_its_one_phase():
    named = {"seed": 1, "phases": [ph("a", 0)]}
    plain = {"seed": 1, "seq_len": 16, "global_batch_size": 8, "lanes": 4, "sources": {"a": 5},
             "recipe": "r" * 64}  # fmt: skip
    st.check_fingerprint(named, plain)
    assert refused(lambda: st.check_fingerprint(named, {**plain, "lanes": 2})).split("\n")[1] == (
        "  phase 'a': lanes: checkpoint has 4, this run has 2"
    )
