"""`hpcrl bench NAME [ARGS...]`: run one benchmark module from ``hpcrl.bench``."""
from __future__ import annotations

import argparse
import importlib
import pkgutil

import hpcrl.bench
from hpcrl.errors import ConfigError


def available() -> list[str]:
    """Benchmark names: the modules of hpcrl.bench with a ``main`` (the others are their shared parts)."""
    names = [m.name for m in pkgutil.iter_modules(hpcrl.bench.__path__)]
    return sorted(n.replace("_", "-") for n in names
                  if hasattr(importlib.import_module("hpcrl.bench." + n), "main"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="benchmark to run; omit to list them")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")


def main(args: argparse.Namespace) -> int:
    names = available()
    if args.name is None:
        for n in names:
            doc = (importlib.import_module("hpcrl.bench." + n.replace("-", "_")).__doc__ or "").strip()
            print(f"{n:28s} {doc.splitlines()[0] if doc else ''}")
        return 0
    if args.name not in names:
        raise ConfigError(f"unknown benchmark {args.name!r}; available: {', '.join(names) or 'none'}")
    module = importlib.import_module("hpcrl.bench." + args.name.replace("-", "_"))
    return int(module.main(args.bench_args) or 0)
