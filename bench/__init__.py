"""Benchmarks of the SpecServing operator on the local control plane (`make bench`, `python -m bench --help`).

See docs/benchmarks.md for the method and the latest results.
"""
