"""The goodput ledger: where a job's time went, across attempts and replica groups.

Terms (docs/unattended.md#goodput):

- **job seconds**: from the first attempt's launch to the last attempt's last
  record, the gaps between attempts included;
- **productive seconds**: the compute of steps committed once, that is steps
  no later attempt trained again;
- **badput**: every other second, by cause (`BADPUT`).

Each process that writes the job's records (rank 0 of a job, of each replica
group) appends one JSON line per event to `goodput/ledger.jsonl` in the dump
folder (`ledger-group<N>.jsonl` for replica group N): the attempt's start, each
step's three parts (quorum, data, compute) and whether it committed, each
checkpoint save (its blocking part), restore and validation, a failure's
teardown, and the end. The lines are written whole, one `write` each, and never
changed.

`summarize` reads every ledger of a dump folder and lays their intervals on
one wall clock. Where intervals overlap (two groups), the instant goes to the
highest cause in `PRIORITY`: a second in which one group trains a step that
counts is productive, whatever the others do. An instant inside an attempt
that no interval covers is `other` (the bookkeeping between steps); one outside
every attempt is `between_attempts`. So the causes add up to the job's seconds
exactly, and `other` says how much of them the ledger did not explain.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from zephon import atomic_write

logger = logging.getLogger("torchtitan")

FOLDER = "goodput"
SUMMARY = "goodput.json"
FORMAT = 1
LAUNCHED_AT_ENV = "TORCHTITAN_LAUNCHED_AT"

BADPUT = (
    "startup",
    "checkpoint_restore",
    "checkpoint_save",
    "data_wait",
    "validation",
    "recovery",
    "steps_redone",
    "between_attempts",
    "other",
)
# Highest first: what an instant counts as when several intervals cover it.
PRIORITY = (
    "productive",
    "steps_redone",
    "checkpoint_save",
    "checkpoint_restore",
    "validation",
    "recovery",
    "data_wait",
    "startup",
    "other",
)
SPANS = ("checkpoint_save", "checkpoint_restore", "validation", "recovery")


def launched_at(environ: dict[str, str] | None = None) -> float:
    """When this attempt began (wall clock): the launcher's time for a first attempt
    (run_train.sh sets it), else this process's own start (torchrun's restarts)."""
    env = os.environ if environ is None else environ
    restarts = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    raw = env.get(LAUNCHED_AT_ENV, "")
    if restarts in ("", "0") and raw:
        try:
            return float(raw)
        except ValueError:
            pass
    return process_started_at()


def process_started_at() -> float:
    """This process's start on the wall clock (Linux: /proc; elsewhere: now)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def ledger_path(dump_folder: str, group: int | None) -> str:
    name = "ledger.jsonl" if group is None else f"ledger-group{group}.jsonl"
    return os.path.join(dump_folder, FOLDER, name)


class Ledger:
    """One process's appender (`path` None: a process that keeps no ledger, and
    every call does nothing)."""

    def __init__(
        self,
        path: str | None,
        started: float,
        group: int | None = None,
        clock: Any = time.time,
    ) -> None:
        self.path, self._clock = path, clock
        self.attempt = uuid.uuid4().hex[:12]
        self._step: list[float] = []
        self._open = 0
        self._failed_at: float | None = None
        self.ended = False
        self._fd: int | None = None
        if path is not None:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as exc:
                logger.warning(f"goodput ledger {path}: {exc.strerror}; this run keeps none")
        self._write({"format": FORMAT, "start": started, "group": group, "pid": os.getpid()})

    def _write(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            return
        line = json.dumps({"a": self.attempt, **record}) + "\n"
        try:
            os.write(self._fd, line.encode())  # one write: whole lines, even with two writers
        except OSError as exc:  # a full or read-only disk: training goes on without it
            logger.warning(f"goodput ledger {self.path}: {exc.strerror}; no more records")
            os.close(self._fd)
            self._fd = None

    def open_step(self, step: int) -> None:
        """Step `step` begins (its quorum first)."""
        self._open, self._step = step, [self._clock()]

    def drop_step(self) -> None:
        """The open step will not be trained (the data ran out): no record."""
        self._step = []

    def mark(self) -> None:
        """The step's current part ends: the quorum, then the data."""
        self._step.append(self._clock())

    def close_step(self, step: int, committed: bool) -> None:
        t = [*self._step, self._clock()]
        if len(t) == 4:
            self._write({"step": step, "t": [round(x, 4) for x in t], "committed": committed})
        self._step = []

    def failed(self) -> None:
        """The attempt failed just now (an exception on its way out): a step still open
        ends here, and the time from here to `end` (waiting for the peers' reports,
        stopping the loader and the monitor) is the failure's `recovery`."""
        if self._failed_at is not None:
            return
        self._failed_at = self._clock()
        if self._step:
            t = [*self._step, *[self._failed_at] * (4 - len(self._step))]
            self._write({"step": self._open, "t": [round(x, 4) for x in t], "committed": False})
            self._step = []

    @contextmanager
    def span(self, cause: str, step: int | None = None) -> Iterator[None]:
        """Time the block as `cause` (one of SPANS)."""
        t0 = self._clock()
        try:
            yield
        finally:
            self._write({"span": cause, "step": step, "t": [round(t0, 4), round(self._clock(), 4)]})

    def end(self, code: int) -> None:
        """The attempt ends with exit status `code`; a step still open (a stop from
        outside, a peer lost: whatever status the process then leaves with) was cut
        short: its time so far counts as a step that did not commit."""
        if self._step:
            self._step += [self._clock()] * (3 - len(self._step))
            self.close_step(self._open, committed=False)
        end = self._clock()
        if self._failed_at is not None:
            t = [round(self._failed_at, 4), round(end, 4)]
            self._write({"span": "recovery", "step": self._open or None, "t": t})
        self._write({"end": round(end, 4), "code": code})
        self.ended = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class Attempt:
    """One process's run as the ledger holds it."""

    id: str
    source: str  # the ledger file's name
    group: int | None = None
    start: float | None = None
    end: float | None = None
    code: int | None = None
    steps: list[tuple[int, list[float], bool]] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)

    def last(self) -> float:
        times = [x for _, t, _ in self.steps for x in t] + [
            t for _, a, b in self.spans for t in (a, b)
        ]
        times += [t for t in (self.start, self.end) if t is not None]
        return max(times)


@dataclass
class Summary:
    job_seconds: float
    productive_seconds: float
    badput_seconds: dict[str, float]
    attempts: int
    groups: list[int | None]
    steps_committed: int  # distinct steps the job kept
    steps_redone: int  # step trainings that did not count (redone later or not committed)
    notes: list[str]
    timeline: list[tuple[float, float, str]]  # the job's causes, from its start (seconds)
    attempt_lanes: list[tuple[str, list[tuple[float, float, str]]]]  # per attempt
    until_now: bool = False

    @property
    def goodput(self) -> float:
        return self.productive_seconds / self.job_seconds if self.job_seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "job_seconds": round(self.job_seconds, 3),
            "productive_seconds": round(self.productive_seconds, 3),
            "goodput": round(self.goodput, 5),
            "badput_seconds": {k: round(v, 3) for k, v in self.badput_seconds.items()},
            "attempts": self.attempts,
            "replica_groups": [g for g in self.groups if g is not None],
            "steps_committed": self.steps_committed,
            "steps_redone": self.steps_redone,
            "running": self.until_now,
            "notes": self.notes,
        }


def read_ledgers(dump_folder: str, running: str | None = None) -> tuple[list[Attempt], list[str]]:
    """Every attempt in the dump folder's ledgers, and a note for each line that could
    not be read (a line cut short by a crash, another format) and each attempt
    without its start or end. `running`: the attempt of a job still running: it has
    no end record yet, and a last line without its newline is one being written;
    neither is a note."""
    folder = os.path.join(dump_folder, FOLDER)
    names = (
        sorted(n for n in os.listdir(folder) if n.endswith(".jsonl"))
        if os.path.isdir(folder)
        else []
    )
    attempts: dict[str, Attempt] = {}
    notes: list[str] = []
    foreign: set[str] = set()  # attempts written by another format
    for name in names:
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            cut = i == len(lines)  # no newline after it: the writer stopped mid-line
            if cut and running is not None:
                continue
            why = _read_line(line, name, attempts, foreign)
            if why:
                what = "cut short (the process stopped while writing it)" if cut else why
                notes.append(f"{FOLDER}/{name} line {i}: {what}; ignored")
    out = []
    for a in attempts.values():
        if a.start is None:
            notes.append(f"{FOLDER}/{a.source}: attempt {a.id} has no start record; "
                         "its time before its first record is not counted")  # fmt: skip
        if a.end is None and a.id != running:
            notes.append(f"{FOLDER}/{a.source}: attempt {a.id} has no end record (stopped "
                         "from outside or still running): it ends at its last record")  # fmt: skip
        if a.steps or a.spans or a.start is not None:
            out.append(a)
    out.sort(key=lambda a: a.start if a.start is not None else a.last())
    return out, notes


def _read_line(
    line: str, source: str, attempts: dict[str, Attempt], foreign: set[str]
) -> str | None:
    """Add one ledger line to its attempt; returns why it cannot be read, if so."""
    try:
        r = json.loads(line)
        if r["a"] in foreign:
            return f"a record of attempt {r['a']}, whose format this version does not read"
        if "start" in r and int(r.get("format", 0)) != FORMAT:
            foreign.add(r["a"])
            return f"ledger format {r.get('format')!r}, this version reads {FORMAT}"
        a = attempts.setdefault(r["a"], Attempt(str(r["a"]), source))
        if "start" in r:
            a.start, a.group = float(r["start"]), r.get("group")
        elif "step" in r and "t" in r and "span" not in r:
            t = [float(x) for x in r["t"]]
            if len(t) != 4:
                return "a step record without its four times"
            a.steps.append((int(r["step"]), t, bool(r["committed"])))
        elif "span" in r:
            if r["span"] not in SPANS:
                return f"unknown span {r['span']!r}"
            a.spans.append((str(r["span"]), float(r["t"][0]), float(r["t"][1])))
        elif "end" in r:
            a.end, a.code = float(r["end"]), r.get("code")
        else:
            return "not a ledger record"
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "not a ledger record"
    return None


def summarize(dump_folder: str, now: float | None = None, running: str | None = None) -> Summary:
    """The job's time by cause. `running`: the attempt id of a process still
    running, whose time goes on until `now`."""
    attempts, notes = read_ledgers(dump_folder, running=running)
    if not attempts:
        raise FileNotFoundError(f"{os.path.join(dump_folder, FOLDER)}: no goodput ledger")
    wasted = _wasted(attempts)
    intervals: list[tuple[float, float, str]] = []
    lanes = []
    for a in attempts:
        end = now if (running == a.id and now is not None) else a.last()
        start = a.start if a.start is not None else min(t[0] for _, t, _ in a.steps)
        own = [(start, end, "other")]
        first_step = min((t[0] for _, t, _ in a.steps), default=end)
        own.append((start, first_step, "startup"))
        own += [(t0, t1, cause) for cause, t0, t1 in a.spans]
        for step, t, committed in a.steps:
            counts = committed and (a.id, step, t[0]) not in wasted
            own += [(t[0], t[1], "recovery"), (t[1], t[2], "data_wait")]
            own.append((t[2], t[3], "productive" if counts else "steps_redone"))
        intervals += own
        lanes.append((_lane_name(a, attempts), own))
    t_start = min(i[0] for i in intervals)
    timeline = _sweep(intervals)
    totals = dict.fromkeys(("productive", *BADPUT), 0.0)
    for t0, t1, cause in timeline:
        totals[cause] += t1 - t0
    kept = {s for a in attempts for s, _, c in a.steps if c}
    redone = sum(1 for a in attempts for s, t, c in a.steps if not c or (a.id, s, t[0]) in wasted)
    return Summary(
        job_seconds=timeline[-1][1] - t_start if timeline else 0.0,
        productive_seconds=totals.pop("productive"),
        badput_seconds=totals,
        attempts=len(attempts),
        groups=sorted({a.group for a in attempts}, key=lambda g: -1 if g is None else g),
        steps_committed=len(kept),
        steps_redone=redone,
        notes=notes,
        timeline=[(t0 - t_start, t1 - t_start, c) for t0, t1, c in timeline],
        attempt_lanes=[(n, [(a - t_start, b - t_start, c) for a, b, c in own]) for n, own in lanes],
        until_now=running is not None,
    )


def _wasted(attempts: list[Attempt]) -> set[tuple[str, int, float]]:
    """The committed step trainings the job did not keep: a later one of the same
    step began after it ended (a restart went back). Two groups training a step
    together overlap in time, so neither is wasted."""
    latest_start: dict[int, float] = {}
    for a in attempts:
        for s, t, c in a.steps:
            if c:
                latest_start[s] = max(latest_start.get(s, t[0]), t[0])
    return {
        (a.id, s, t[0]) for a in attempts for s, t, c in a.steps if c and latest_start[s] > t[3]
    }


def _sweep(intervals: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Cut the union of the intervals' span into segments, each given the highest
    cause that covers it (`between_attempts` where none does); neighbours with the
    same cause merged."""
    rank = {c: i for i, c in enumerate(PRIORITY)}
    events = sorted(
        [(t0, 1, c) for t0, t1, c in intervals if t1 > t0]
        + [(t1, -1, c) for t0, t1, c in intervals if t1 > t0]
    )
    active = [0] * len(PRIORITY)
    out: list[tuple[float, float, str]] = []
    prev: float | None = None
    for t, delta, cause in events:
        if prev is not None and t > prev:
            top = next((PRIORITY[i] for i, n in enumerate(active) if n > 0), "between_attempts")
            if out and out[-1][2] == top and out[-1][1] == prev:
                out[-1] = (out[-1][0], t, top)
            else:
                out.append((prev, t, top))
        active[rank[cause]] += delta
        prev = t
    return out


def _lane_name(a: Attempt, attempts: list[Attempt]) -> str:
    same = [b for b in attempts if b.group == a.group]
    n = same.index(a) + 1
    return f"attempt {n}" if a.group is None else f"group {a.group} #{n}"


def write_summary(dump_folder: str, summary: Summary) -> str:
    path = os.path.join(dump_folder, SUMMARY)
    atomic_write(path, json.dumps(summary.to_json(), indent=1) + "\n", durable=False)
    return path


def report(summary: Summary, where: str) -> list[str]:
    """The breakdown as lines for a terminal."""
    s = summary
    groups = [g for g in s.groups if g is not None]
    who = f", replica groups {','.join(map(str, groups))}" if groups else ""
    lines = [
        f"goodput of {where}: {100 * s.goodput:.1f}% (productive {s.productive_seconds:.1f} s "
        f"of {s.job_seconds:.1f} s; {s.attempts} attempt{'s' * (s.attempts != 1)}{who})",
        f"  steps: {s.steps_committed} kept, {s.steps_redone} trained again or not committed",
        "  badput by cause:",
    ]
    for cause in BADPUT:
        secs = s.badput_seconds.get(cause, 0.0)
        share = 100 * secs / s.job_seconds if s.job_seconds else 0.0
        lines.append(f"    {cause:<20} {secs:9.1f} s {share:6.1f}%")
    lines += [f"  note: {n}" for n in s.notes]
    return lines


def open_ledger(cfg: Any, rank: int) -> Ledger:
    """This process's ledger: rank 0 of the job, or of its replica group, keeps one."""
    ft = cfg.fault_tolerance
    group = ft.replica_id if ft.enable else None
    path = ledger_path(cfg.job.dump_folder, group) if rank == 0 else None
    return Ledger(path, launched_at(), group)


def publish(dump_folder: str, ledger: Ledger) -> Summary | None:
    """goodput.json from every ledger of the dump folder, this attempt counted up to
    now; None (and a warning) where it cannot be written: the run goes on."""
    try:
        running = None if ledger.ended else ledger.attempt
        summary = summarize(dump_folder, now=time.time(), running=running)
        write_summary(dump_folder, summary)
    except (OSError, ValueError) as exc:
        logger.warning(f"goodput: {os.path.join(dump_folder, SUMMARY)} not written ({exc})")
        return None
    return summary


class Report:
    """goodput.json for the process that writes the job's records. At a checkpoint it
    is made on a thread of its own (reading every ledger takes about a second at
    100,000 steps: the steps go on meanwhile) and `take` hands the result to the
    next log step; at the end it is made on the caller's thread, after the end
    record."""

    def __init__(self, dump_folder: str, ledger: Ledger) -> None:
        self.dump_folder, self.ledger = dump_folder, ledger
        self._thread: threading.Thread | None = None
        self._done: Summary | None = None

    def refresh(self) -> None:
        """Begin a new goodput.json, unless one is being made."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._make, name="goodput", daemon=True)
        self._thread.start()

    def _make(self) -> None:
        self._done = publish(self.dump_folder, self.ledger)

    def take(self) -> Summary | None:
        """The latest summary made since the last `take`, if any."""
        done, self._done = self._done, None
        return done

    def final(self) -> Summary | None:
        """The job's goodput.json as this attempt ends."""
        if self._thread is not None:
            self._thread.join()
        return publish(self.dump_folder, self.ledger)
