"""Start torchft's lighthouse with this project's defaults (docs/fault_tolerance.md):

    python -m torchtitan.runtime.lighthouse --port 29510 --min-replicas 1

It forms the quorum of replica groups at every step. A group that stops sending
heartbeats for `--heartbeat-timeout-ms` is left out of the next quorum: that, not
a restart, bounds the time a lost group costs the others. Prints its address
(what FT_LIGHTHOUSE names) and serves until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

# A quorum waits this long for a live group that has not asked yet: above twice the
# default `[fault_tolerance] step_timeout_s` (30 s), so a group held up by a
# collective that times out, then by the next, still joins (docs/fault_tolerance.md).
JOIN_TIMEOUT_MS = 65_000


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m torchtitan.runtime.lighthouse")
    ap.add_argument("--host", default="[::]", help="address to bind (default: every one)")
    ap.add_argument("--port", type=int, default=29510, help="0 = any free port")
    ap.add_argument("--min-replicas", type=int, default=1, help="groups a quorum needs")
    ap.add_argument(
        "--heartbeat-timeout-ms", type=int, default=2000,
        help="a group silent this long is left out of the next quorum",
    )  # fmt: skip
    ap.add_argument(
        "--join-timeout-ms", type=int, default=JOIN_TIMEOUT_MS,
        help="how long a quorum waits for a live group that has not asked yet (one "
        "starting, or one whose communicator is still forming): shorter lets groups "
        "form a quorum without a live one",
    )  # fmt: skip
    ap.add_argument("--quorum-tick-ms", type=int, default=50)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from torchft._torchft import LighthouseServer
    except ImportError:
        print("error: torchft is not installed: pip install -e '.[ft]'", file=sys.stderr)
        return 2
    server = LighthouseServer(
        bind=f"{args.host}:{args.port}",
        min_replicas=args.min_replicas,
        join_timeout_ms=args.join_timeout_ms,
        quorum_tick_ms=args.quorum_tick_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    address = server.address()
    print(f"lighthouse at {address} (FT_LIGHTHOUSE={address.split('://')[-1]})", flush=True)
    done.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
