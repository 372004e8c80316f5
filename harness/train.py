"""The harness that tests and demo scripts use to launch training runs: one
torchrun job on CPU processes, and reading back what it logged.

Imported as `harness.train` by the tests, the scripts and the benchmarks (see
harness/__init__.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
BUILD_SAMPLE_DATA = REPO / "scripts" / "tools" / "build_sample_data.py"
LOADERS = ("zephon", "hf")


class RunFailed(RuntimeError):
    """A training run exited non-zero or timed out."""


def ensure_sample_data() -> None:
    """Build the bundled sample corpus if it is missing (a few seconds)."""
    if not (SAMPLE / "MANIFEST.json").is_file():
        subprocess.run(
            [sys.executable, str(BUILD_SAMPLE_DATA), "--out", str(SAMPLE)],
            check=True,
        )


@contextlib.contextmanager
def immutable(folder: Path) -> Iterator[None]:
    """Nobody, root included, may add to or remove from `folder` while inside
    (chattr +i): a dump or checkpoint folder that cannot be written."""
    subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@contextlib.contextmanager
def etcd_server(folder: Path, timeout: float = 30) -> Iterator[str]:
    """A real etcd (Debian's etcd-server) on 127.0.0.1 with the v2 API that torchrun's
    etcd-v2 rendezvous speaks, in `folder`; yields its client endpoint host:port."""
    from torchtitan.distributed.utils import free_port

    exe = shutil.which("etcd")
    if exe is None:
        raise RuntimeError("etcd is not installed: apt-get install etcd-server")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    client, peer = free_port(), free_port()
    cmd = [
        exe, "--name", "rdzv", "--data-dir", str(folder / "data"), "--enable-v2=true",
        "--listen-client-urls", f"http://127.0.0.1:{client}",
        "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"rdzv=http://127.0.0.1:{peer}",
    ]  # fmt: skip
    with open(folder / "etcd.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        import urllib.request

        end = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/v2/keys", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"etcd did not start: see {folder / 'etcd.log'}") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def torchrun_train(
    nproc: int,
    dump: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """`torchrun --nproc-per-node nproc -m torchtitan.train ARGS --job.dump_folder dump`
    on CPU (gloo, one thread per process); output captured, never raises on failure."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(nproc), "-m", "torchtitan.train",
        *args, "--job.dump_folder", str(dump),
    ]  # fmt: skip
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(
        cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def overrides(fields: dict[str, Any]) -> list[str]:
    """{"training.steps": 12, "data.log_batch_digests": True} -> trainer CLI arguments."""
    out: list[str] = []
    for key, value in fields.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out += [f"--{key}", text]
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_metrics(dump: Path) -> dict[int, dict[str, Any]]:
    """step -> the last training record logged for it (`metrics.jsonl`)."""
    return {int(r["step"]): r for r in _read_jsonl(dump / "metrics.jsonl")}


def read_validation(dump: Path) -> dict[int, float]:
    """step -> validation loss at full precision (`validation.jsonl`)."""
    return {int(r["step"]): float(r["val_loss"]) for r in _read_jsonl(dump / "validation.jsonl")}


def data_digests(
    steps: int,
    seq_len: int,
    global_batch: int,
    recipe: Path = REPO / "train_configs" / "data" / "sample_mix.toml",
    tokenizer: Path = REPO / "assets" / "tokenizer" / "tokenizer.json",
) -> dict[int, str]:
    """step -> the digest of its global batch, from the data alone (one rank reading
    every lane): what every run of that recipe logs, whatever its process count."""
    from zephon import ZephonLoader, global_batch_digest

    loader = ZephonLoader(recipe, tokenizer, seq_len, global_batch, num_workers=0, prefetch=0)
    try:
        return {s: global_batch_digest(loader.next_batch().digests) for s in range(1, steps + 1)}
    finally:
        loader.close()


def copy_checkpoint(src_dump: Path, step: int, dst_dump: Path) -> None:
    """Seed a new run folder with one step of another run's checkpoints."""
    name = Path("checkpoint") / f"step-{step}"
    shutil.copytree(src_dump / name, dst_dump / name)


def run_logged(
    nproc: int, dump: Path, args: list[str], timeout: float | None = None
) -> tuple[str, float]:
    """`torchrun_train`, its output kept in `dump/train.log`; returns (stdout, wall
    seconds) and raises RunFailed with the output's tail if the run failed."""
    started = time.perf_counter()
    try:
        proc = torchrun_train(nproc, dump, args, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RunFailed(f"{dump}: no result after {timeout}s") from exc
    output = proc.stdout + "\n--- stderr ---\n" + proc.stderr
    dump.mkdir(parents=True, exist_ok=True)
    (dump / "train.log").write_text(output)
    if proc.returncode:
        last = "\n".join(output.splitlines()[-25:])
        raise RunFailed(f"{dump}: trainer exited {proc.returncode}\n{last}")
    return proc.stdout, time.perf_counter() - started


def compare(
    label: str, got: dict[int, dict[str, Any]], ref: dict[int, dict[str, Any]], steps: range
) -> dict[str, Any]:
    """One run against a reference over `steps`: whether every global-batch digest is
    equal, and the largest relative loss difference (inf where a step is missing)."""
    digests = all(got.get(s, {}).get("digest") == ref[s]["digest"] for s in steps)
    rel = max(
        abs(got[s]["loss"] - ref[s]["loss"]) / abs(ref[s]["loss"]) if s in got else float("inf")
        for s in steps
    )
    return {"run": label, "steps": len(steps), "digests_equal": digests, "max_rel_dloss": rel}


def render_results(path: Path, page: Callable[[dict[str, Any]], str]) -> int:
    """Write `path`'s .md page from its raw results JSON (`page` renders it) and print
    it; exit status 2 with a message if the JSON cannot be read."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: {path}: cannot read the results: {exc}", file=sys.stderr)
        return 2
    text = page(doc)
    path.with_suffix(".md").write_text(text)
    print(text, end="")
    return 0


def quote_in_page(page: str, name: str, text: str) -> None:
    """Put `text` between the `<!-- name:begin -->` and `<!-- name:end -->` markers of
    `page`, a documentation page given relative to the repository (each script names
    its page as QUOTED_IN): figures the docs quote are written by their script, never
    by hand. Nothing happens when the page or its markers are missing."""
    path = REPO / page
    body = path.read_text() if path.is_file() else ""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin in body and end in body:
        head, rest = body.split(begin, 1)
        path.write_text(head + begin + "\n" + text + rest[rest.index(end) :])


def results_args(doc: str) -> argparse.Namespace:
    """The command line every results script shares: `--out` (the results folder) and
    `--render JSON` (no runs: rewrite the page from the raw results)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    p.add_argument("--render", type=Path, default=None, help="no runs: results JSON -> .md")
    return p.parse_args()


def pick_scenarios(p: argparse.ArgumentParser, text: str, known: Sequence[str]) -> list[str]:
    """The comma-separated `--scenarios` subset, in the order given; an unknown name
    is a usage error naming the known ones."""
    names = [s for s in text.split(",") if s]
    unknown = [s for s in names if s not in known]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {', '.join(known)}")
    return names


def parse_sizes(text: str) -> list[int]:
    """argparse type for process counts such as "1,2,8"."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_loaders(text: str) -> list[str]:
    """argparse type for loader lists such as "zephon,hf"."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names or any(n not in LOADERS for n in names):
        raise argparse.ArgumentTypeError(f"loaders must be among {', '.join(LOADERS)}")
    return names
