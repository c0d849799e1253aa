"""`hpcrl [-q | -v] run | sweep | submit | analyze | bench | info | convert | eval | export`.

Each subcommand lives in its own module under ``hpcrl.commands`` with two
functions: ``add_arguments(parser)`` and ``main(args) -> int``. The module is
imported only when its subcommand is used, so ``hpcrl info`` never imports
torch or mpi4py. ``-q`` / ``-v`` (before or after the command name) set how much is printed
(:mod:`hpcrl.verbosity`).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

from hpcrl.errors import ConfigError

# subcommand -> (module, one-line help)
COMMANDS = {
    "run": ("hpcrl.commands.run", "train: the roles as MPI ranks (launch.runner mpi), all in this process "
                                  "(serial), or in virtual time on a cluster profile (sim); --inside-mpi runs this "
                                  "rank's role"),
    "profiles": ("hpcrl.commands.profiles", "the cluster profiles a simulated job (launch.runner: sim) runs on, "
                                            "their costs and sources"),
    "sweep": ("hpcrl.commands.sweep", "run a sweep spec's configs x arms x seeds, N at a time; resumable (its state in "
                                      "SWEEP_DIR/sweep.json)"),
    "submit": ("hpcrl.commands.submit", "render a batch script for a site and submit it (sbatch/qsub)"),
    "analyze": ("hpcrl.commands.analyze", "post-hoc analysis of run directories: figures, CSV, HTML report"),
    "bench": ("hpcrl.commands.bench", "run a benchmark and print its table"),
    "info": ("hpcrl.commands.info", "versions, MPI library, devices, registered environments"),
    "convert": ("hpcrl.commands.convert", "rewrite run directories' (or single) HDF5 files in HDF5 1.10's format (older readers)"),
    "eval": ("hpcrl.commands.eval", "play a run's checkpointed policy for N episodes: mean/std return and length, "
                                    "--video mp4s"),
    "export": ("hpcrl.commands.export", "write a run's policy as TorchScript (or ONNX), normalisation folded in, "
                                        "and a JSON of its spaces"),
}


class _PrintVersion(argparse.Action):
    """``--version``: looks the version up (package metadata) only when asked."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        import hpcrl

        print(f"hpcrl {hpcrl.__version__}")
        parser.exit()


def add_verbosity(parser: argparse.ArgumentParser, default=None) -> None:
    """``-q`` / ``-v`` (:mod:`hpcrl.verbosity`), accepted before and after the command name."""
    from hpcrl.verbosity import QUIET, VERBOSE

    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=QUIET, default=default,
                       help="print only warnings, errors and the final summary (no start or progress lines)")
    group.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=VERBOSE, default=default,
                       help="print more: the run's plan, and a progress line with every update (loss terms too)")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpcrl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_PrintVersion, help="print hpcrl's version and exit")
    add_verbosity(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_verbosity(p, default=argparse.SUPPRESS)  # after the name: overrides one given before it
        if name == wanted:  # import only the module that will run
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    # the command began when this process did (imports included), unless a program calls main() itself
    called_at = None if argv is None else time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    if next((a for a in argv if not a.startswith("-")), None) == "run":
        from hpcrl.runtime.runners import prestart
        from hpcrl.runtime.signals import remember_stop_signals

        remember_stop_signals()  # before the imports: a cancel during start-up ends the run as a cancel
        prestart.start_early(argv)  # the ranks' imports begin while this process imports the config's
        try:
            return _main(argv, called_at)
        finally:
            prestart.drop_early()
    return _main(argv, called_at)


def _main(argv: list[str], called_at: float | None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.command_unix = called_at
    from hpcrl import verbosity

    verbosity.set_level(verbosity.NORMAL if args.verbosity is None else args.verbosity)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    if not getattr(module, "RESUMES_COLLECTION", False):
        from hpcrl.runtime import collector

        collector.resume()  # start-up is over (runtime/collector.py); `run` says when its roles are built
    try:
        return int(module.main(args) or 0)
    except ConfigError as exc:
        print(f"hpcrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hpcrl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (hpcrl sweep --list | head): not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error as Python flushes at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
