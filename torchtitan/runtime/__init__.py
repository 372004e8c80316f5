"""Keeping a multi-process job honest: one error message from any rank
(failure.py), heartbeats and a watchdog in the rendezvous store (monitor.py),
one writer per dump folder (dump_lock.py) and the launcher wrapper that prints
the failure once and maps it to an exit code (launcher.py)."""
