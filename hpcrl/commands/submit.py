"""`hpcrl submit --site NAME [--nodes N --time HH:MM:SS --account A --queue Q --dry-run] [CONFIG]`.

Renders the site's batch script for CONFIG (with -o overrides), shows it with --dry-run, and
otherwise writes it with the resolved config next to the run directory (RUN_DIR.job/), submits
it with sbatch or qsub and prints the job id. The job starts the run, or resumes it from its last
checkpoint when it runs again.
"""
from __future__ import annotations

import argparse
import sys

from hpcrl.config import load_config
from hpcrl.sites import load_site, site_names
from hpcrl.submit import plan_job, render, submit, submit_command, write_job


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config (default: the embedded CartPole-v1 job)")
    parser.add_argument("--site", required=True, help=f"where to run: {', '.join(site_names())}")
    parser.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. -o stop.total_env_steps=2000 (repeatable)")
    parser.add_argument("--nodes", type=int, help="nodes (default: enough for one rank per core)")
    parser.add_argument("--min-nodes", type=int, help="Slurm: a job that lost nodes comes back on as few as this "
                        "(--nodes=MIN-N); its actors are the ranks the nodes it gets hold beyond the parameter and "
                        "learner ranks")
    parser.add_argument("--run-dir", help="absolute or relative run directory (default: io.run_dir filled in now)")
    add_batch_arguments(parser)


def add_batch_arguments(parser: argparse.ArgumentParser, each: str = "") -> None:
    """The batch flags ``hpcrl submit`` and ``hpcrl sweep --site`` share (``each``: " of each task", for an array)."""
    parser.add_argument("--time", help=f"walltime{each} HH:MM:SS (default: the site's)")
    parser.add_argument("--account", help="project to charge (Slurm -A, PBS -A)")
    parser.add_argument("--queue", help="PBS queue, Slurm QOS (Perlmutter) or partition (default: the site's)")
    parser.add_argument("--python", help="Python on the compute nodes, outside a container (default: this one)")
    parser.add_argument("--env-script", help="shell file the job sources first (module loads, conda activate)")
    parser.add_argument("--warning-seconds", type=int, default=120,
                        help="checkpoint and requeue this long before the walltime (default 120)")
    parser.add_argument("--max-restarts", type=int, default=10, help=f"stop requeueing after this many{each} (default 10)")
    parser.add_argument("--dry-run", action="store_true", help="print the script; write and submit nothing")


def main(args: argparse.Namespace) -> int:
    site = load_site(args.site)
    cfg = load_config(args.config, args.overrides)
    job = plan_job(cfg, site, nodes=args.nodes, time=args.time, account=args.account, queue=args.queue,
                   run_dir=args.run_dir, python=args.python, warning_seconds=args.warning_seconds,
                   max_restarts=args.max_restarts, env_script=args.env_script, overrides=tuple(args.overrides),
                   min_nodes=args.min_nodes)
    script = render(job)
    if args.dry_run:
        sys.stdout.write(script)
        print(f"# dry run: would write {job.script_path} and run: {' '.join(submit_command(job))}", file=sys.stderr)
        return 0
    path = write_job(job, cfg, script)
    job_id = submit(job)
    print(f"submitted job {job_id}: {path}", file=sys.stderr)
    print(f"run directory: {job.run_dir}", file=sys.stderr)
    print(job_id)
    return 0
