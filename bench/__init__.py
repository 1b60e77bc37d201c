"""Benchmarks that print ratios against a baseline measured in the same run.

Each ``bench/bench_<name>.py`` exposes ``main(argv) -> None | int``; run them with
``python -m bench [name ...] [options for the modules]`` (see bench/__main__.py).
"""
