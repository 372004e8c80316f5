"""Importing zephon and running a loader leave the process's settings alone:
environment variables, torch's intra- and inter-op thread counts, signal
handlers and the working directory; and close() leaves no threads behind.

Runs in a fresh interpreter so that the import itself is covered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = r"""
import json, os, signal, sys, threading

def settings():
    import torch
    return {
        "env": dict(os.environ),
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "signals": [repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
        "cwd": os.getcwd(),
    }

env = dict(os.environ)
base = settings()  # imports torch, not zephon
base["env"] = env  # as before torch was imported
import zephon
after_import = settings()
loader = zephon.ZephonLoader(
    sys.argv[1], sys.argv[2], seq_len=32, global_batch_size=16, num_workers=2, prefetch=2
)
steps = [loader.next_batch().step for _ in range(4)]
running = sorted(t.name for t in threading.enumerate() if t.name.startswith("zephon"))
loader.close()
left = sorted(t.name for t in threading.enumerate() if t.name.startswith("zephon"))
print(json.dumps({"base": base, "after_import": after_import, "after_run": settings(),
                  "steps": steps, "running": running, "left": left}))
"""


def test_import_and_loader_leave_process_settings_unchanged(
    make_recipe: Any, tokenizer_path: str, tmp_path: Path
) -> None:
    recipe = make_recipe(workers=2, prefetch=2)
    # Settings a library might be tempted to change: they must survive as given.
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true"}
    env.pop("ZEPHON_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(recipe), tokenizer_path],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    base = got["base"]
    assert base["env"]["OMP_NUM_THREADS"] == "2"
    for when in ("after_import", "after_run"):
        now = got[when]
        added = sorted(set(now["env"]) - set(base["env"]))
        removed = sorted(set(base["env"]) - set(now["env"]))
        changed = sorted(
            k for k in base["env"] if k in now["env"] and now["env"][k] != base["env"][k]
        )
        assert (added, removed, changed) == ([], [], []), f"{when}: os.environ changed"
        assert now["threads"] == base["threads"], f"{when}: torch thread counts changed"
        assert now["signals"] == base["signals"], f"{when}: signal handlers changed"
        assert now["cwd"] == base["cwd"] == str(tmp_path)
    assert got["steps"] == [0, 1, 2, 3]
    assert "zephon-prefetch" in got["running"]
    assert {"zephon-plan", "zephon-tokenize"} <= set(got["running"])
    assert got["left"] == [], "close() left threads running"
