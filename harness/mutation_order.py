"""pytest plugin for mutation runs: a mutant's tests run fastest first.

mutmut's fork server hands a mutant's tests to pytest in no particular order,
and pytest stops at the first failure (-x). Ordered by the durations mutmut
measured in its stats run, as its plain fork runner orders them, a killed
mutant costs its quickest killing test instead of, on average, half of the
tests that reach it. Loaded only by `[tool.mutmut] pytest_add_cli_args`
(`-p harness.mutation_order`; mutmut copies harness/ into mutants/, which it
puts on the path).
"""

from __future__ import annotations

from typing import Any


def pytest_collection_modifyitems(items: list[Any]) -> None:
    from mutmut.state import state

    durations = state().duration_by_test
    if durations:  # empty during the stats run itself
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
