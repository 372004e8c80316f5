from pathlib import Path

import pytest
from helpers import REPO

from torchtitan.config.job_config import ConfigError, JobConfig, load_job_config, to_toml


def write(tmp_path: Path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    cfg = load_job_config([])
    assert cfg == JobConfig()
    assert cfg.job.config_file == ""
    assert cfg.model.attention == "doc_causal"
    assert cfg.training.seq_len == 256
    assert cfg.checkpoint.load_step == -1
    assert cfg.lr_scheduler.decay_type == "linear"
    assert cfg.data.loader == "zephon"
    assert cfg.data.hf_resume == "refuse"
    d = cfg.to_dict()
    assert d["optimizer"]["lr"] == 3e-4
    assert set(d) == {
        "job",
        "model",
        "training",
        "parallelism",
        "checkpoint",
        "optimizer",
        "lr_scheduler",
        "metrics",
        "validation",
        "data",
        "fault_tolerance",
        "moe",
    }


def test_toml_load_and_int_to_float(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[training]\nsteps = 7\nmax_norm = 2\ncompile = true\n[model]\nattention = "causal"\n',
    )
    cfg = load_job_config(["--job.config_file", path])
    assert cfg.job.config_file == path
    assert cfg.training.steps == 7
    assert cfg.training.max_norm == 2.0 and isinstance(cfg.training.max_norm, float)
    assert cfg.training.compile is True
    assert cfg.model.attention == "causal"
    assert cfg.training.seq_len == 256  # untouched fields keep defaults


def test_cli_overrides_both_syntaxes_and_win_over_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[training]\nsteps = 7\nseed = 3\n")
    cfg = load_job_config(
        [
            f"--job.config_file={path}",
            "--training.steps",
            "11",
            "--training.seed=-4",
            "--optimizer.lr",
            "1e-3",
            "--data.log_batch_digests",
            "yes",
            "--training.deterministic",  # bare boolean flag
            "--job.dump_folder=out/a=b",
        ]
    )
    assert cfg.training.steps == 11
    assert cfg.training.seed == -4
    assert cfg.optimizer.lr == 1e-3
    assert cfg.data.log_batch_digests is True
    assert cfg.training.deterministic is True
    assert cfg.job.dump_folder == "out/a=b"


@pytest.mark.parametrize(
    "text,expected",
    [("true", True), ("False", False), ("1", True), ("0", False), ("no", False)],
)
def test_cli_bool_spellings(text: str, expected: bool) -> None:
    assert load_job_config(["--training.compile", text]).training.compile is expected


def test_shipped_configs_load() -> None:
    for name in ("llama3_debugmodel", "llama3_1b", "llama3_8b"):
        path = str(REPO / "train_configs" / f"{name}.toml")
        cfg = load_job_config(["--job.config_file", path])
        assert cfg.model.name == "llama3"
    cfg = load_job_config(["--job.config_file", str(REPO / "train_configs/llama3_debugmodel.toml")])
    assert (cfg.training.steps, cfg.checkpoint.interval, cfg.optimizer.lr) == (40, 20, 1e-3)
    assert cfg.data.log_batch_digests is True


def test_to_toml_round_trip(tmp_path: Path) -> None:
    cfg = load_job_config(["--optimizer.eps", "1e-8", "--job.description", 'say "hi"\n'])
    path = write(tmp_path, to_toml(cfg))
    again = load_job_config(["--job.config_file", path])
    again.job.config_file = cfg.job.config_file
    assert again == cfg


def error(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_job_config(argv)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_error_missing_file(tmp_path: Path) -> None:
    msg = error(["--job.config_file", str(tmp_path / "nope.toml")])
    assert "nope.toml" in msg and "not found" in msg


def test_error_toml_syntax(tmp_path: Path) -> None:
    path = write(tmp_path, "[training]\nsteps = = 3\n", name="broken.toml")
    msg = error(["--job.config_file", path])
    assert "broken.toml" in msg and "not valid TOML" in msg and "line 2" in msg


def test_error_unknown_section_in_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[trainig]\nsteps = 3\n", name="typo.toml")
    msg = error(["--job.config_file", path])
    assert "typo.toml" in msg and "[trainig]" in msg and "did you mean [training]" in msg


def test_error_unknown_field_in_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[training]\nseq_length = 3\n", name="typo.toml")
    msg = error(["--job.config_file", path])
    assert "typo.toml" in msg and "'seq_length'" in msg and "[training]" in msg
    assert "did you mean 'seq_len'" in msg


def test_error_section_not_a_table(tmp_path: Path) -> None:
    msg = error(["--job.config_file", write(tmp_path, "training = 3\n")])
    assert "training" in msg and "table" in msg


def test_error_wrong_type_in_toml(tmp_path: Path) -> None:
    path = write(tmp_path, '[training]\nseq_len = "256"\n')
    msg = error(["--job.config_file", path])
    assert "job.toml" in msg and "[training] seq_len" in msg and "'256'" in msg
    assert "expected an integer" in msg
    msg = error(["--job.config_file", write(tmp_path, "[training]\ncompile = 1\n")])
    assert "[training] compile = 1" in msg and "boolean" in msg
    msg = error(["--job.config_file", write(tmp_path, "[training]\nsteps = 2.0\n")])
    assert "[training] steps = 2.0" in msg and "integer" in msg


def test_error_bad_choice_in_toml(tmp_path: Path) -> None:
    path = write(tmp_path, '[lr_scheduler]\ndecay_type = "exp"\n')
    msg = error(["--job.config_file", path])
    assert "job.toml" in msg and "[lr_scheduler] decay_type = 'exp'" in msg
    assert "'linear'" in msg and "'cosine'" in msg


def test_error_cli_unknown_section_and_field() -> None:
    msg = error(["--trainng.steps", "3"])
    assert "--trainng.steps" in msg and "did you mean [training]" in msg
    msg = error(["--training.stepz=3"])
    assert "'stepz'" in msg and "did you mean 'steps'" in msg


def test_error_cli_bad_values() -> None:
    msg = error(["--training.steps", "1.5"])
    assert "command line" in msg and "[training] steps = '1.5'" in msg and "integer" in msg
    msg = error(["--training.compile=maybe"])
    assert "[training] compile = 'maybe'" in msg and "boolean" in msg
    msg = error(["--optimizer.lr", "fast"])
    assert "[optimizer] lr = 'fast'" in msg and "number" in msg
    msg = error(["--model.attention", "full"])
    assert "[model] attention = 'full'" in msg and "'doc_causal'" in msg
    msg = error(["--data.hf_resume=ignore"])
    assert "hf_resume" in msg and "'refuse'" in msg and "'skip'" in msg


def test_error_cli_malformed() -> None:
    assert "unexpected argument 'steps'" in error(["steps"])
    assert "--section.field" in error(["--steps", "3"])
    assert "needs a value" in error(["--training.seq_len"])
    assert "needs a path" in error(["--job.config_file"])


def test_error_out_of_range(tmp_path: Path) -> None:
    msg = error(["--training.seq_len", "0"])
    assert "command line" in msg and "[training] seq_len = 0" in msg and ">= 1" in msg
    path = write(tmp_path, "[lr_scheduler]\ndecay_ratio = 1.5\n")
    msg = error(["--job.config_file", path])
    assert "job.toml" in msg and "decay_ratio = 1.5" in msg and "[0, 1]" in msg


def test_explicit_shape_tracks_what_the_user_set(tmp_path: Path) -> None:
    """The recipe's first data phase may only disagree with values the user chose:
    defaults are not choices, the config file and the command line are."""
    assert load_job_config([]).explicit_shape() == ()
    path = write(tmp_path, "[training]\nseq_len = 128\nsteps = 3\n")
    cfg = load_job_config(["--job.config_file", path])
    assert cfg.explicit_shape() == ("seq_len",)
    assert cfg.set_by("training", "seq_len") == f"config file {path!r} (line 2)"
    assert cfg.set_by("training", "global_batch_size") is None
    cfg = load_job_config(["--job.config_file", path, "--training.global_batch_size", "8"])
    assert cfg.explicit_shape() == ("seq_len", "global_batch_size")
    assert (
        cfg.set_by("training", "global_batch_size") == "command line (--training.global_batch_size)"
    )


def test_micro_batch_in_rows_or_tokens(tmp_path: Path) -> None:
    assert load_job_config([]).training.local_batch_tokens == 0
    cfg = load_job_config(["--training.local_batch_tokens", "512"])
    assert (cfg.training.local_batch_tokens, cfg.training.local_batch_size) == (512, 4)
    # Both in the same place: one error naming both.
    msg = error(["--training.local_batch_tokens", "512", "--training.local_batch_size", "2"])
    assert "local_batch_tokens = 512" in msg and "local_batch_size = 2" in msg
    assert "set one of them" in msg
    both = write(tmp_path, "[training]\nlocal_batch_size = 2\nlocal_batch_tokens = 512\n")
    assert "set one of them" in error(["--job.config_file", both])
    # Across places the command line wins, like every other field.
    rows = write(tmp_path, "[training]\nlocal_batch_size = 2\n", name="rows.toml")
    cfg = load_job_config(["--job.config_file", rows, "--training.local_batch_tokens", "512"])
    assert (cfg.training.local_batch_tokens, cfg.training.local_batch_size) == (512, 4)
    assert cfg.set_by("training", "local_batch_size") is None
    tokens = write(tmp_path, "[training]\nlocal_batch_tokens = 512\n", name="tokens.toml")
    cfg = load_job_config(["--job.config_file", tokens, "--training.local_batch_size", "3"])
    assert (cfg.training.local_batch_tokens, cfg.training.local_batch_size) == (0, 3)
    msg = error(["--training.local_batch_tokens", "-1"])
    assert "[training] local_batch_tokens = -1" in msg and "0 (off)" in msg
