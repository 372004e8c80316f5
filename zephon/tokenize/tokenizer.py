"""The tokenizer: loading it, choosing its special tokens, and framing documents' ids.

`load_tokenizer` reads a Hugging Face `tokenizer.json` (or a tokenizer folder)
and decides the end-of-text, pad and optional beginning-of-text tokens, with
the recipe's `[tokenizer]` section first. The encoding functions are
stateless and pure per document: a document's ids never depend on what else
was in its call, so the scheduler (scheduler.py) may group documents into
calls as it likes. Pretokenized documents are checked against the
vocabulary here too, with the one check `zephon validate --scan` uses.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import DataError, ZephonError
from zephon.schema.recipe import SourceSpec

EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")
PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]")
TOKENIZER_FILE = "tokenizer.json"
# Where a Hugging Face tokenizer folder names its special tokens, most specific first.
FOLDER_CONFIGS = ("tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class TokenizerInfo:
    tokenizer: Tokenizer
    eos_id: int
    pad_id: int
    vocab_size: int
    fingerprint: str  # sha256 of the serialized tokenizer
    bos_id: int | None = None
    add_bos: bool = False  # prepend bos_id to every document
    path: str = ""  # the tokenizer.json file or folder it was loaded from
    choices: dict[str, Any] | None = None
    """The special tokens chosen, when they differ from what a bare tokenizer.json
    gives (EOS and PAD found by name, no BOS); None otherwise, so the fingerprint
    of every run that worked before stays the same (docs/design.md §11)."""


def tokenizer_file(path: str | os.PathLike[str]) -> str:
    """The `tokenizer.json` of `path` (the file itself, or inside a folder)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        file = os.path.join(p, TOKENIZER_FILE)
        if not os.path.isfile(file):
            raise ZephonError(f"{p}: tokenizer folder has no {TOKENIZER_FILE}")
        return file
    if not os.path.isfile(p):
        raise ZephonError(f"{p}: tokenizer file not found")
    return p


def _token_name(value: Any, where: str) -> str | None:
    """A special-token entry: a string, a {"content": ...} dict, or null."""
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    if isinstance(value, str):
        return value
    raise ZephonError(f'{where}: expected a token string or {{"content": ...}}, got {value!r}')


def _folder_settings(folder: str) -> dict[str, tuple[Any, str]]:
    """eos/bos/pad token names and add_bos from a tokenizer folder's config files,
    each with the file it came from (tokenizer_config.json wins)."""
    found: dict[str, tuple[Any, str]] = {}
    for name in reversed(FOLDER_CONFIGS):  # later files overwrite: the first wins
        file = os.path.join(folder, name)
        if not os.path.isfile(file):
            continue
        try:
            with open(file, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ZephonError(f"{file}: cannot read the tokenizer config: {exc}") from None
        if not isinstance(data, dict):
            raise ZephonError(f"{file}: expected a JSON object")
        for key in ("eos", "bos", "pad"):
            if f"{key}_token" in data:
                value = _token_name(data[f"{key}_token"], f"{file}: {key}_token")
                if value is not None:
                    found[key] = (value, f"{file}: {key}_token")
        if "add_bos_token" in data:
            if not isinstance(data["add_bos_token"], bool):
                raise ZephonError(
                    f"{file}: add_bos_token: expected true or false, got {data['add_bos_token']!r}"
                )
            found["add_bos"] = (data["add_bos_token"], f"{file}: add_bos_token")
    return found


def load_tokenizer(
    path: str | os.PathLike[str], settings: Any = None, origin: str = "recipe"
) -> TokenizerInfo:
    """Load a Hugging Face `tokenizer.json`, or a tokenizer folder, and choose its
    end-of-text, pad and (optional) beginning-of-text tokens.

    Order of precedence: the recipe's `[tokenizer]` section (`settings`, a
    `TokenizerSpec`; `origin` names its file in errors), then a folder's `tokenizer_config.json` and
    `special_tokens_map.json`, then well-known names (EOS_CANDIDATES,
    PAD_CANDIDATES; PAD falls back to EOS).
    """
    given = os.fspath(path)
    file = tokenizer_file(given)
    try:
        tok = Tokenizer.from_file(file)
    except Exception as exc:  # the Rust side raises a plain Exception
        raise ZephonError(f"{file}: not a Hugging Face tokenizer.json: {exc}") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    folder = _folder_settings(given) if os.path.isdir(given) else {}
    for key in ("eos", "bos", "pad", "add_bos"):
        value = getattr(settings, key, None) if settings is not None else None
        if value not in (None, ""):
            folder[key] = (value, f"{origin}: [tokenizer] {key}")

    def token_id(key: str) -> int | None:
        if key not in folder:
            return None
        name, where = folder[key]
        if name not in vocab:
            raise ZephonError(f"{where}: token {name!r} is not in the vocabulary of {file}")
        return vocab[name]

    by_name_eos = next((vocab[t] for t in EOS_CANDIDATES if t in vocab), None)
    by_name_pad = next((vocab[t] for t in PAD_CANDIDATES if t in vocab), by_name_eos)
    eos = token_id("eos")
    eos = by_name_eos if eos is None else eos
    if eos is None:
        searched = (
            f"neither {' nor '.join(FOLDER_CONFIGS)} in {given} names an eos_token, and "
            if os.path.isdir(given)
            else ""
        )
        raise ZephonError(
            f"{file}: no end-of-text token: {searched}the vocabulary has none of "
            f'{EOS_CANDIDATES}; name it in the recipe: [tokenizer] eos = "<token>"'
        )
    pad = token_id("pad")
    pad = (by_name_pad if by_name_pad is not None else eos) if pad is None else pad
    add_bos = bool(folder.get("add_bos", (False, ""))[0])
    bos = token_id("bos")
    if add_bos and bos is None:
        raise ZephonError(
            f"{folder['add_bos'][1]} asks for a beginning-of-text token, but {given} names no "
            f'bos_token; name it in the recipe: [tokenizer] bos = "<token>"'
        )
    choices = None
    if eos != by_name_eos or pad != by_name_pad or add_bos:
        choices = {"eos": eos, "pad": pad, "bos": bos if add_bos else None}
    fingerprint = hashlib.sha256(tok.to_str().encode()).hexdigest()
    size = tok.get_vocab_size(with_added_tokens=True)
    return TokenizerInfo(tok, eos, pad, size, fingerprint, bos, add_bos, given, choices)


def resolve_tokenizer(
    tokenizer: str | os.PathLike[str] | TokenizerInfo, recipe: Any
) -> TokenizerInfo:
    """The tokenizer a loader uses: `tokenizer` with the recipe's `[tokenizer]` section applied."""
    spec = recipe.tokenizer
    if isinstance(tokenizer, TokenizerInfo):
        if not spec.non_default():
            return tokenizer
        tokenizer = tokenizer.path
    return load_tokenizer(tokenizer, spec, recipe.path)


def _frame(ids: Any, tok: TokenizerInfo) -> np.ndarray:
    """A document's ids with EOS appended (and BOS prepended when asked for)."""
    first = 1 if tok.add_bos else 0
    arr = np.empty(len(ids) + first + 1, dtype=np.int32)
    if first:
        arr[0] = tok.bos_id
    arr[first:-1] = ids
    arr[-1] = tok.eos_id
    return arr


def token_id_error(spec: SourceSpec, doc: int, ids: Any, vocab_size: int) -> str | None:
    """Why document `doc` of a pretokenized source cannot be used (a token id
    outside the vocabulary), or None when its ids are fine."""
    # Checked before narrowing to int32, so a huge id cannot overflow first. Arrays
    # (Parquet token lists, token-array sources) are checked without per-token Python.
    if isinstance(ids, np.ndarray):
        top = int(ids.max()) if len(ids) else 0
    else:
        top = max(ids, default=0)
    if top < vocab_size:
        return None
    return (
        f"source '{spec.name}' ({', '.join(spec.paths)}) document {doc}: token id {top} is "
        f"outside the tokenizer's vocabulary ({vocab_size})"
    )


def check_token_ids(
    values: list[Any], doc_ids: list[int], spec: SourceSpec, tok: TokenizerInfo
) -> list[np.ndarray]:
    """Pretokenized documents: their ids checked against the vocabulary and framed."""
    docs = []
    for ids, doc in zip(values, doc_ids, strict=True):
        problem = token_id_error(spec, doc, ids, tok.vocab_size)
        if problem is not None:
            raise DataError(problem)
        docs.append(_frame(ids, tok))
    return docs


def encode_raw(texts: list[str], tok: TokenizerInfo) -> list[Any]:
    """The tokenizer's encodings of `texts` (its own thread pool, GIL released).

    `encode_batch_fast` gives the same ids as `encode_batch` without computing
    character offsets, which nothing here uses."""
    t = tok.tokenizer
    encode = getattr(t, "encode_batch_fast", None) or t.encode_batch
    return encode(texts, add_special_tokens=False)


def frame_ids(encodings: list[Any], tok: TokenizerInfo) -> list[np.ndarray]:
    """Each encoding's ids framed as `_frame` does (EOS, and BOS if asked).

    The ids of the whole call go through one Python list into one array, and
    each document is a view of it: converting document by document costs an
    array and a copy each."""
    flat: list[int] = []
    bounds = [0]
    bos, eos = ([tok.bos_id] if tok.add_bos else []), tok.eos_id
    for enc in encodings:
        flat.extend(bos)
        flat.extend(enc.ids)
        flat.append(eos)
        bounds.append(len(flat))
    arr = np.fromiter(flat, dtype=np.int32, count=len(flat))
    return [arr[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def encode_texts(texts: list[str], tok: TokenizerInfo) -> list[np.ndarray]:
    """Token ids of each text, framed as `_frame` does (EOS, and BOS if asked)."""
    return frame_ids(encode_raw(texts, tok), tok)
