"""Consumers used by the consumption benchmarks (``bench/consume.py``)."""
