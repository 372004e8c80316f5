"""`python -m torchtitan.runtime.launcher [torchrun arguments]`: torchrun that
reports a failure once, restarts only what a restart can fix, and stops cleanly.

It runs torch.distributed.run in this process with an error folder for the
node (`TORCHTITAN_ERROR_DIR`); a failing rank writes its message there (see
failure.py). On failure the launcher prints that message, instead of
torchrun's ChildFailedError report, whatever rank it came from, so
`--local-ranks-filter 0` hides nothing, and exits 2 for the user's input, 1
for anything else. A failure of another node arrives as a summary that a rank
of this node wrote when the failure ended it.

Elastic launches (`--nnodes MIN:MAX`, `--max-restarts`) use the restart
policy of agent.py. SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 are the launcher's
own (preemption.py): the first asks the ranks to stop after a checkpoint of
the current step, and the launcher then exits with `PREEMPT_EXIT_CODE`
(default 3); a second one stops at once. Workers get their rendezvous store
from the rank-0 worker of each round, not from the agent, so a restart never
reuses a store of an earlier round.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

import torch.distributed as dist

from torchtitan.runtime import failure, preemption, preflight
from torchtitan.torch_compat import floor_message, parse_torchrun_args


def _records(folder: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    own, summary = [], None
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json") or name.startswith(
            (preemption.STOPPED_PREFIX, preemption.STOP_REQUEST)
        ):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if name == "summary.json":
            summary = rec
        else:
            own.append(rec)
    return own, summary


def report_failures(folder: str, failures: dict[int, Any]) -> int:
    """Print the failure once; returns the exit code."""
    own, summary = _records(folder)
    if own:
        # The root cause is the earliest record; a user error outranks the
        # secondary failures it causes.
        rec = min(own, key=lambda r: (r["kind"] != "user", r["time"]))
        # An error every rank hit alike (a bad checkpoint) is the job's, not rank k's.
        rec = min((r for r in own if r["message"] == rec["message"]), key=lambda r: r["rank"])
        print(failure.format_record(rec), file=sys.stderr, flush=True)
        return failure.KINDS.get(rec["kind"], failure.EXIT_CRASH)
    if summary:
        print(failure.format_record(summary, summary=True), file=sys.stderr, flush=True)
        return failure.KINDS.get(summary["kind"], failure.EXIT_CRASH)
    print(f"error: {lost_ranks_line(failures)}", file=sys.stderr, flush=True)
    return failure.EXIT_CRASH


def lost_ranks_line(failures: dict[int, Any]) -> str:
    """What ended a job whose ranks left no record. Ranks killed by a signal, the
    others stopped by the launcher (exit 128 + SIGTERM): a process killed from
    outside the job (an operator, the out-of-memory killer), and the rest stopped
    after it; anything else keeps the generic line."""
    stopped = 128 + signal.SIGTERM
    parts, killed, other = [], False, False
    for rank, f in sorted(failures.items()):
        code = getattr(f, "exitcode", None)
        if code is not None and code < 0:
            killed = True
            parts.append(f"rank {rank} killed by {signal.Signals(-code).name}")
        elif code == stopped:
            parts.append(f"rank {rank} stopped by the launcher")
        else:
            other = True
            parts.append(f"rank {rank} exit {code}")
    if killed and not other:
        line = (
            f"no rank reported an error ({', '.join(parts)}): a process was killed from "
            "outside the job (an operator, the out-of-memory killer) and the others were "
            "stopped after it"
        )
        group = os.environ.get("FT_REPLICA_ID")
        if group is not None:
            line += f"; replica group {group} left the job (run it again to rejoin)"
        return line
    return f"the job failed without a message from a rank ({', '.join(parts)}); see the log above"


def report_end(folder: str, failures: dict[int, Any]) -> int:
    """After workers failed: a rank told to stop at once is the root cause of what
    followed; else a rank's own failure record, or a worker that ended otherwise than
    a stop does (killed by a signal: an out-of-memory kill, say), outranks the stops
    that followed it (a peer whose collective broke during a requested stop); else
    the stop."""
    records = preemption.stop_records(folder)
    own, summary = _records(folder)
    stop_codes = {0, preemption.exit_code()}
    other_end = any(getattr(f, "exitcode", None) not in stop_codes for f in failures.values())
    if preemption.original_stop(records) is None and (own or summary or other_end):
        return report_failures(folder, failures)
    stopped = report_stop(folder)
    return report_failures(folder, failures) if stopped is None else stopped


def report_stop(folder: str) -> int | None:
    """After the workers exited: the preemption exit status, with one line, if
    they stopped early (with a checkpoint, or at once); None otherwise."""
    records = preemption.stop_records(folder)
    if not records:
        return None
    code = preemption.exit_code()
    # A rank that stopped at once outranks the ranks that saw it go.
    rec = min(records, key=lambda r: (not r.get("original"), not r.get("at_once"), r["rank"]))
    where = f"at step {rec['step']} " if rec.get("step") is not None else ""
    who = f"rank {rec['rank']}, " if rec.get("at_once") else ""
    print(
        f"stopped {where}({who}{rec['reason']}): {rec['what']}; exit {code} "
        "(run the same command again to resume)",
        file=sys.stderr,
        flush=True,
    )
    return code


def report_rendezvous_lost(args: Any, exc: BaseException, formed: bool) -> int:
    """One line for a rendezvous that failed: after the job formed, its host (c10d:
    the first node's agent; etcd-v2: the etcd server) is gone and the job can be
    requeued (the preemption status); before, the endpoint is wrong (exit 2)."""
    where = f"{args.rdzv_endpoint} ({args.rdzv_backend} rendezvous)"
    what = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    if not formed:
        print(
            f"error: cannot reach the rendezvous at {where}: {what}; check RDZV_ENDPOINT",
            file=sys.stderr,
            flush=True,
        )
        return failure.EXIT_USER
    code = preemption.exit_code()
    host = "the rendezvous host" if args.rdzv_backend == "c10d" else "the rendezvous server"
    print(
        f"error: lost {host} {where}: {what}; the job cannot re-form without it (with "
        f"RDZV_BACKEND=etcd-v2 no node is special); exit {code}: run the same command "
        "again on every node to resume from the newest complete checkpoint",
        file=sys.stderr,
        flush=True,
    )
    return code


def report_agent_failure(folder: str, exc: BaseException) -> int:
    """The launcher's own failure, below the workers' if they had one (the worker's
    error is then the first line and sets the exit status)."""
    own, summary = _records(folder)
    code = report_end(folder, {}) if own or summary or preemption.stop_records(folder) else None
    what = failure.raised_at(exc)
    if code is None:
        print(f"error: the launcher failed: {what}", file=sys.stderr, flush=True)
        return failure.EXIT_CRASH
    print(f"(then the launcher failed while stopping the workers: {what})", file=sys.stderr,
          flush=True)  # fmt: skip
    return code


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from torchtitan.runtime import agent

    too_old = floor_message()
    if too_old:
        print(f"error: {too_old}", file=sys.stderr, flush=True)
        return failure.EXIT_USER
    # run_train.sh quietens the launcher's C++ warnings; its workers get the user's level.
    user_level = os.environ.pop("TORCHTITAN_USER_CPP_LOG_LEVEL", None)
    if user_level == "unset":
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    elif user_level is not None:
        os.environ["TORCH_CPP_LOG_LEVEL"] = user_level
    folder = tempfile.mkdtemp(prefix="torchtitan-errors-")
    os.environ[failure.ERROR_DIR_ENV] = folder
    # A fresh store per rendezvous round (the agent's shared store keeps the keys
    # and the address of an earlier round across a restart).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    args, ignored = parse_torchrun_args(sys.argv[1:] if argv is None else argv)
    args.signals_to_handle = "SIGHUP,SIGQUIT"  # the stop signals are ours
    try:
        agent.window_from_env()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return failure.EXIT_USER
    # Refused once here, before any worker starts: one line and exit 2 every time.
    refused = preflight.problems(args)
    if refused:
        print(f"error: {refused[0]}", file=sys.stderr, flush=True)
        return failure.EXIT_USER
    for option in ignored:
        agent.say(f"{option} ignored: this torch's torchrun has no such option")
    agent.install(folder)
    # torchrun's own reports repeat what report_failures and agent.say print; its
    # modules set their loggers' levels themselves, so each is quietened.
    for name in ["torch.distributed.elastic", *logging.root.manager.loggerDict]:
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    signals = preemption.LauncherSignals(folder, agent.workers_running)
    signals.install()
    try:
        torchrun.run(args)
        stopped = report_stop(folder)
        return 0 if stopped is None else stopped
    except ChildFailedError as exc:
        return report_end(folder, exc.failures)
    except (RendezvousError, dist.DistError) as exc:
        # Closing the rendezvous after the workers failed finds its host gone (the
        # host's launcher ended on the same failure): the workers' failure is the news.
        failed = exc.__context__
        if isinstance(failed, ChildFailedError):
            return report_end(folder, failed.failures)
        own, summary = _records(folder)
        if own or summary or preemption.stop_records(folder):
            # A worker's failure (or another node's, summarised here) came first: the
            # host's launcher ended on it, which is why the rendezvous is gone.
            return report_end(folder, {})
        return report_rendezvous_lost(args, exc, agent.job_formed())
    except SignalException as exc:
        first = signals.received or signal.Signals(exc.sigval).name
        print(
            f"stopped at once ({first}): no checkpoint of the current step; the newest "
            "complete checkpoint is the resume point",
            file=sys.stderr,
            flush=True,
        )
        return preemption.exit_code()
    except Exception as exc:
        # The agent's own code failed (in torch, or in agent.py), perhaps while it
        # stopped workers that had failed first: their error stays the news.
        return report_agent_failure(folder, exc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
