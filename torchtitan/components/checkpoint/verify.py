"""`python -m torchtitan.components.checkpoint verify PATH [--mode full|size]`.

PATH is one step folder (`.../checkpoint/step-40`) or a checkpoint folder
holding several; each step is checked against its manifest (see
manifest.py beside this file). Exit status 0 when every step verifies,
2 otherwise; folders without a COMPLETE.json are reported as unfinished saves.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from torchtitan.components.checkpoint import manifest


def _verify(path: str, mode: str) -> bool:
    t0 = time.perf_counter()
    try:
        v = manifest.verify_step_dir(path, mode)
    except manifest.CheckpointError as exc:
        print(f"FAIL {path}: {exc}")
        return False
    size = sum(
        os.path.getsize(os.path.join(path, n))
        for n in os.listdir(path)
        if os.path.isfile(os.path.join(path, n))
    )
    note = (
        " (written before manifests: only the marker and loader step checked)" if v.legacy else ""
    )
    print(
        f"ok   {path}: step {v.step}, {size / 2**20:.1f} MiB, {mode} check in "
        f"{time.perf_counter() - t0:.2f}s{note}"
    )
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchtitan.components.checkpoint", description=__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("verify", help="check step folders against their manifests")
    p.add_argument("path", help="a step-N folder or a folder of them")
    p.add_argument("--mode", choices=manifest.VERIFY_MODES, default="full")
    a = parser.parse_args(argv)
    path = os.path.normpath(a.path)
    if not os.path.isdir(path):
        print(f"error: {path}: no such folder", file=sys.stderr)
        return 2
    if manifest.STEP_DIR.match(os.path.basename(path)):
        targets = [path]
    else:
        targets = [os.path.join(path, f"step-{s}") for s in manifest.step_dirs(path)]
        if not targets:
            print(f"error: {path}: no step-N folders", file=sys.stderr)
            return 2
    ok = True
    for t in targets:
        if not os.path.isfile(os.path.join(t, manifest.COMPLETE_FILE)):
            print(f"skip {t}: no {manifest.COMPLETE_FILE} (a save that never finished)")
            continue
        ok = _verify(t, a.mode) and ok
    return 0 if ok else 2
