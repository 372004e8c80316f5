"""The strict TOML reading both configurations share (zephon/schema/toml.py): every
message names the file and the line of the key, an unknown key comes with the
nearest known one, and a value's type is the one asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchtitan.config.job_config import ConfigError, load_job_config
from zephon import RecipeError, load_recipe
from zephon.schema.toml import Table, key_lines, matches

RECIPE = """\
# a comment
[recipe]
name = "x"
lanes = 2

[[source]]
name = "a"
path = "a.jsonl"

[[source]]
name = "b"
note = '''
a multi-line string
wieght = 3
'''
path = "b.jsonl"
wieght = 3.0
"""


def test_key_lines_follow_tables_arrays_of_tables_and_multiline_strings():
    lines = key_lines(RECIPE)
    assert lines[("recipe", "lanes")] == 4
    assert lines[("source[0]", "path")] == 8
    assert lines[("source[1]", "")] == 10  # its header
    assert lines[("source[1]", "path")] == 16
    assert lines[("source[1]", "wieght")] == 17  # not the one inside the string
    assert lines[("source[1]", "note")] == 12


def test_a_recipe_error_names_its_line_and_the_nearest_key(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "y"}\n')
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.replace("note = '''\na multi-line string\nwieght = 3\n'''\n", ""))
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert str(err.value).startswith(f"{recipe}:13: [source 'b'] has unknown key(s): wieght; ")
    assert "did you mean 'weight'?" in str(err.value)
    recipe.write_text(RECIPE.replace("lanes = 2", 'lanes = "2"'))
    with pytest.raises(RecipeError, match=r"r\.toml:4: recipe\.lanes: expected int, got '2'"):
        load_recipe(recipe)


def test_the_job_config_names_its_line_and_the_nearest_field(tmp_path: Path):
    config = tmp_path / "job.toml"
    config.write_text("[training]\nsteps = 3\n\nstepz = 4\n")
    with pytest.raises(ConfigError) as err:
        load_job_config(["--job.config_file", str(config)])
    assert str(err.value).startswith(f"config file {str(config)!r} (line 4): unknown field 'stepz'")
    assert "did you mean 'steps'?" in str(err.value)
    config.write_text("[training]\n\nsteps = true\n")
    with pytest.raises(ConfigError, match=r"\(line 3\): \[training\] steps = True is invalid"):
        load_job_config(["--job.config_file", str(config)])


def test_types_are_toml_types():
    assert matches(3, (float,)) == (True, 3.0)
    assert matches(True, (int,)) == (False, True)  # a boolean is never a number
    assert matches(1, (bool,)) == (False, 1)
    t = Table("f.toml", "packing", {"open_bins": 4, "algorithm": "best_fitt"}, RecipeError)
    assert t.get("open_bins", int) == 4
    with pytest.raises(RecipeError, match="got 'best_fitt'; did you mean 'best_fit'"):
        t.choice("algorithm", ("concat", "best_fit"))
