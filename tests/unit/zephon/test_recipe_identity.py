"""The recipe digest takes a new setting only when a recipe sets it (docs/design.md §11).

Fields that existed when digests were first pinned always enter the digest;
the list below pins them, so a field added later cannot be marked "always" by
mistake (that would change every existing recipe's digest and refuse every
checkpoint). A later field enters only when it differs from its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from zephon.schema.recipe import (
    ALWAYS,
    NEVER,
    ImageSpec,
    MixtureSpec,
    PackingSpec,
    ShuffleSpec,
    SourceSpec,
    TokenizerSpec,
    identity_of,
)

PINNED_ALWAYS = {
    SourceSpec: {
        "name",
        "paths",
        "format",
        "text_field",
        "token_field",
        "weight",
        "on_exhausted",
        "hf_builder",
    },
    MixtureSpec: {"unit", "on_exhausted"},
    ShuffleSpec: {"enabled", "block_size"},
    PackingSpec: {"algorithm", "open_bins", "flush_interval"},
    TokenizerSpec: set(),
    ImageSpec: set(),
}


def test_only_the_pinned_fields_always_enter_the_digest():
    for spec, pinned in PINNED_ALWAYS.items():
        always = {f.name for f in fields(spec) if f.metadata.get("identity") == "always"}
        assert always == pinned, spec.__name__


@dataclass(frozen=True)
class _Spec:
    old: int = field(default=1, metadata=ALWAYS)
    how: str = field(default="fast", metadata=NEVER)
    new: int = 0  # a field added after digests were pinned


def test_a_new_field_enters_only_when_set():
    assert identity_of(_Spec()) == {"old": 1}
    assert identity_of(_Spec(new=3)) == {"old": 1, "new": 3}
    assert identity_of(_Spec(how="slow")) == {"old": 1}  # never data identity
    assert identity_of(_Spec(old=1)) == identity_of(_Spec())


def test_tokenizer_overrides_enter_only_when_set():
    assert TokenizerSpec().non_default() == {}
    assert TokenizerSpec(add_bos=False).non_default() == {"add_bos": False}
