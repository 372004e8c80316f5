"""The supported torch range (issue 40): the declared floor is the tested one, every
torch difference inside the range is handled (each branch tested, whatever torch
runs the suite: .ci/run runs it under the pinned torch and under the floor), and
the launcher's own failures never hide a worker's error."""

from __future__ import annotations

import argparse
import inspect
import json
import re
import signal
import tomllib

import pytest
from helpers import REPO
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from torchtitan import torch_compat
from torchtitan.runtime import agent, failure, launcher, preemption


def _pin(path: str) -> str:
    found = re.search(r"^torch==(\S+)", (REPO / path).read_text(), re.M)
    assert found, f"{path} pins no torch"
    return found.group(1)


def test_the_declared_floor_is_the_tested_one_and_the_top_the_pinned_one():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_dep,) = [d for d in deps if re.match(r"torch\b", d)]
    floor, top = re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", torch_dep).groups()
    assert floor == torch_compat.TORCH_FLOOR
    assert _pin("requirements-floor.txt").startswith(floor + ".")
    pinned = _pin("requirements-ci.txt")
    major, minor = map(int, pinned.split(".")[:2])
    assert top == f"{major}.{minor + 1}", "the range ends right after the pinned torch"
    assert torch_compat.TORCH_TESTED == (_pin("requirements-floor.txt"), pinned)
    # .ci/run builds the floor venv from requirements-floor.txt and tests there
    ci = (REPO / ".ci" / "run").read_text()
    assert "requirements-floor.txt" in ci and ".venv-floor/bin/python -m pytest" in ci


@pytest.mark.parametrize(
    "version, ok",
    [("2.11.0", True), ("2.11.0+cu130", True), ("2.13.0+cpu", True), ("2.10.1+cu128", False),
     ("2.9.0", False), ("1.13.1", False)],
)  # fmt: skip
def test_a_torch_below_the_floor_is_one_line_naming_both_versions(version, ok):
    message = torch_compat.floor_message(version)
    if ok:
        assert message is None
    else:
        assert message is not None and "\n" not in message
        assert f"torch {version} is installed" in message
        assert f"needs torch >= {torch_compat.TORCH_FLOOR}" in message


def _torchrun_like(with_shutdown_timeout: bool) -> argparse.ArgumentParser:
    """torchrun's argument shape: options, then the script and its arguments."""
    p = argparse.ArgumentParser()
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    p.add_argument("--standalone", action="store_true")
    if with_shutdown_timeout:
        p.add_argument("--shutdown-timeout", "--shutdown_timeout", type=int, default=30)
    p.add_argument("-m", "--module", action="store_true")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


ARGV = ["--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "15", "-m",
        "torchtitan.train", "--training.steps", "3"]  # fmt: skip


def test_a_torchrun_with_shutdown_timeout_gets_it():
    args, ignored = torch_compat.parse_torchrun_args(ARGV, _torchrun_like(True))
    assert (args.shutdown_timeout, ignored) == (15, [])
    assert args.training_script_args == ["--training.steps", "3"]


def test_a_torchrun_without_shutdown_timeout_parses_the_rest_and_names_it():
    args, ignored = torch_compat.parse_torchrun_args(ARGV, _torchrun_like(False))
    assert ignored == ["--shutdown-timeout 15"]
    assert not hasattr(args, "shutdown_timeout")
    assert (args.nproc_per_node, args.training_script) == ("2", "torchtitan.train")
    assert args.training_script_args == ["--training.steps", "3"]
    # the underscore spelling and the `=` form too
    args, ignored = torch_compat.parse_torchrun_args(
        ["--shutdown_timeout=9", "x.py"], _torchrun_like(False)
    )
    assert ignored == ["--shutdown-timeout 9"] and args.training_script == "x.py"


def test_the_installed_torchrun_parses_every_option_run_train_sh_passes():
    argv = ["--nnodes", "1:4", "--node-rank", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            "h:1", "--rdzv-id", "x", "--max-restarts", "3", "--monitor-interval", "1",
            "--shutdown-timeout", "15", "--rdzv-conf", "join_timeout=600", "--nproc-per-node",
            "2", "--local-ranks-filter", "0", "--role", "rank", "--tee", "3", "-m",
            "torchtitan.train", "--job.config_file", "c.toml"]  # fmt: skip
    args, ignored = torch_compat.parse_torchrun_args(argv)
    assert args.training_script == "torchtitan.train" and args.nnodes == "1:4"
    if ignored:  # torch 2.11: no such option, and the launcher says so
        assert ignored == ["--shutdown-timeout 15"]
    else:
        assert args.shutdown_timeout == 15


def _bare_agent(tmp_path) -> agent.PolicyAgent:
    """A PolicyAgent with just what `_shutdown` reads (no rendezvous, no workers)."""
    a = object.__new__(agent.PolicyAgent)
    a._error_dir = str(tmp_path)
    a._worker_watchdog = None
    a._health_check_server = None
    a._pcontext = None
    return a


def test_the_agents_shutdown_accepts_what_the_installed_torch_passes(tmp_path):
    params = list(inspect.signature(LocalElasticAgent._shutdown).parameters.values())[1:]
    full = [signal.SIGTERM, 5][: len(params)]
    for call in ((), tuple(full)):
        _bare_agent(tmp_path)._shutdown(*call)
        mark = tmp_path / preemption.AGENT_STOPPING
        assert mark.exists()
        mark.unlink()


@pytest.mark.parametrize("torch_version", ["2.11", "2.13"])
def test_the_agents_shutdown_passes_either_signature_through(tmp_path, monkeypatch, torch_version):
    calls = []

    def shutdown_211(self, death_sig=signal.SIGTERM):
        calls.append((death_sig,))

    def shutdown_213(self, death_sig=signal.SIGTERM, timeout=30):
        calls.append((death_sig, timeout))

    base = shutdown_211 if torch_version == "2.11" else shutdown_213
    monkeypatch.setattr(LocalElasticAgent, "_shutdown", base)
    a = _bare_agent(tmp_path)
    a._shutdown()
    a._shutdown(signal.SIGKILL)
    if torch_version == "2.13":
        a._shutdown(signal.SIGTERM, 7)
        assert calls[-1] == (signal.SIGTERM, 7)
    assert calls[:2] == [(signal.SIGTERM,) + ((30,) if torch_version == "2.13" else ()),
                         (signal.SIGKILL,) + ((30,) if torch_version == "2.13" else ())]  # fmt: skip
    assert (tmp_path / preemption.AGENT_STOPPING).exists()


def test_the_workers_error_stays_first_when_the_agent_fails_while_stopping_them(tmp_path, capsys):
    rec = failure.record(1, "user", "training.stepz: unknown key; did you mean training.steps?")
    (tmp_path / "rank-1.json").write_text(json.dumps(rec))
    broken = TypeError("LocalElasticAgent._shutdown() takes from 1 to 2 positional arguments")
    assert launcher.report_agent_failure(str(tmp_path), broken) == failure.EXIT_USER
    first, second = capsys.readouterr().err.strip().splitlines()
    assert first == "error (rank 1): training.stepz: unknown key; did you mean training.steps?"
    assert "launcher failed while stopping the workers: TypeError" in second
    # no worker failed: the launcher's own failure is the news, a crash
    (tmp_path / "rank-1.json").unlink()
    assert launcher.report_agent_failure(str(tmp_path), broken) == failure.EXIT_CRASH
    assert capsys.readouterr().err.startswith("error: the launcher failed: TypeError")


def test_the_launcher_reports_the_worker_when_torchrun_raises_after_it(monkeypatch, capsys):
    """launcher.main end to end with torchrun's run replaced by one whose worker
    failed and whose agent then raised while stopping the others."""
    from torch.distributed import run as torchrun
    from torch.distributed.launcher import api

    monkeypatch.setattr(api, "LocalElasticAgent", api.LocalElasticAgent)  # restored after
    for name in (failure.ERROR_DIR_ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        monkeypatch.setenv(name, "")  # main sets them: restored after
    saved = {s: signal.getsignal(s) for s in preemption.STOP_SIGNALS}

    def run(args):
        rec = failure.record(0, "user", "bad data in shard 3")
        failure.write_record(rec)
        raise TypeError("_shutdown() takes 2 positional arguments but 3 were given")

    monkeypatch.setattr(torchrun, "run", run)
    try:
        code = launcher.main(["--standalone", "--nproc-per-node", "1", "worker.py"])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == failure.EXIT_USER
    assert err[0] == "error: bad data in shard 3"
    assert "TypeError: _shutdown() takes 2 positional arguments" in err[1]


def test_compile_needs_a_compiler_and_the_python_headers(monkeypatch, tmp_path):
    import shutil

    assert torch_compat.compile_problem("cpu") is None  # this machine has both
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    problem = torch_compat.compile_problem("cpu")
    assert problem.startswith("training.compile = true needs a C++ compiler (g++ or clang++")
    assert problem.endswith("set --training.compile false")
    monkeypatch.setenv("CXX", "/opt/none/g++")
    assert "a C++ compiler (CXX=/opt/none/g++ on PATH)" in torch_compat.compile_problem("cpu")
    monkeypatch.undo()
    import sysconfig

    paths = sysconfig.get_paths()
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {**paths, "include": str(tmp_path)})
    assert "the Python headers" in torch_compat.compile_problem("cpu")


@pytest.mark.parametrize("has_single", [True, False], ids=["2.13 name", "2.11 name"])
def test_the_all_gather_into_one_tensor_under_either_name(one_process_group, monkeypatch,
                                                           has_single):  # fmt: skip
    import warnings

    import torch
    import torch.distributed as dist

    if not has_single:
        monkeypatch.delattr(dist, "all_gather_single", raising=False)
    elif not hasattr(dist, "all_gather_single"):
        pytest.skip("this torch has only all_gather_into_tensor")
    t = torch.arange(6, dtype=torch.int64).view(2, 3)
    out = torch.zeros(2, 3, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated call where avoidable
        if not has_single:
            warnings.simplefilter("ignore", FutureWarning)
        torch_compat.all_gather_tensor(out, t, None)
    assert torch.equal(out, t)
