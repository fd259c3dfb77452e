"""Benchmarks of the batch runner and its store, each against a baseline
measured in the same run: ``python -m bench`` (see :mod:`bench.run`)."""
