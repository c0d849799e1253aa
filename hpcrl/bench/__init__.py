"""Benchmarks run by `hpcrl bench NAME`: each module here has ``main(argv) -> int`` and prints a table.

They are not tests: they take minutes and compare against a baseline measured in the same run.
"""
