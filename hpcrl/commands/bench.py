"""`hpcrl bench NAME [ARGS...]`: run one benchmark module from ``hpcrl.bench``."""
from __future__ import annotations

import argparse
import importlib
import pkgutil

import hpcrl.bench
from hpcrl.errors import ConfigError


def modules() -> list[str]:
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(hpcrl.bench.__path__))


def _load(name: str):
    return importlib.import_module("hpcrl.bench." + name.replace("-", "_"))


def available() -> list[str]:
    """Benchmark names: the modules of hpcrl.bench with a ``main`` (the others are their shared parts; finding
    out imports every module, so only the listing and an unknown name pay for it)."""
    return [n for n in modules() if hasattr(_load(n), "main")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="benchmark to run; omit to list them")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")


def main(args: argparse.Namespace) -> int:
    if args.name is None:
        for n in available():
            doc = (_load(n).__doc__ or "").strip()
            print(f"{n:28s} {doc.splitlines()[0] if doc else ''}")
        return 0
    module = _load(args.name) if args.name in modules() else None
    if module is None or not hasattr(module, "main"):
        raise ConfigError(f"unknown benchmark {args.name!r}; available: {', '.join(available()) or 'none'}")
    return int(module.main(args.bench_args) or 0)
