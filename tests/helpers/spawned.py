"""The end of a test's own spawned rank (multiprocessing, a gloo group of its own)."""

from __future__ import annotations

import sys
import traceback

from torchtitan.distributed.utils import exit_process


def leave_process_group() -> None:
    """Call last in a spawned rank (in its `finally`): end the process without gloo's
    teardown, which can abort it after collectives ("terminate called without an
    active exception", exit -6) however right its work was. An exception on its way
    out keeps its traceback and a failing status; otherwise the ranks meet at a
    barrier and exit 0 (torchtitan.distributed.utils.exit_process)."""
    failed = sys.exc_info()[1]
    if failed is not None:
        traceback.print_exception(failed)
        exit_process(1)
    exit_process(0)
