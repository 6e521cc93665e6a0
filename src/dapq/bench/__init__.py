"""Benchmarks: task generators, metrics and runners."""
