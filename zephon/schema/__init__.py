"""The schema: what a data recipe may say, as frozen dataclasses (recipe.py), and
the strict TOML reading that both the recipe and the trainer's job config use
(toml.py). No I/O beyond reading a given file, and no other stage imported.

A public face (like `zephon`, `zephon.images`, `zephon.sources`): the trainer's
job config reads its TOML with these."""

from zephon.schema.toml import KeyLines, Table, did_you_mean, key_lines, matches, read_toml

__all__ = ["KeyLines", "Table", "did_you_mean", "key_lines", "matches", "read_toml"]
