"""What the tests, the scripts and the benchmarks share to drive this repository:
launching training runs and reading their logs (`harness.train`), the launcher jobs
that fault experiments break (`harness.faults`), the generated image part of the
sample corpus (`harness.sample_images`) and the pytest plugin of the mutation runs
(`harness.mutation_order`).

A trainer user never needs it; it is installed with the project (pyproject's
`packages.find`), so `python scripts/experiments/x.py`, pytest and the benchmarks
import it as `harness.<module>` with no path set up by hand."""
