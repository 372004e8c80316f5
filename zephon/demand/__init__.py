"""Demand: what to read and tokenize next (planner, lookahead, feeds) and the worker
threads that do it (executor, reading)."""
