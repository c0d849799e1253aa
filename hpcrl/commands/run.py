"""`hpcrl run [CONFIG] [-o KEY=VALUE ...] [--runner mpi|serial] [--resume RUN_DIR] [--inside-mpi] [--ranks N]`.

Without ``--inside-mpi`` this process is the launcher: it resolves and validates the whole
config and makes its :class:`~hpcrl.runtime.plan.Plan` (nothing is written when anything is
wrong), creates the run directory with the resolved ``config.yaml``, prints one line saying
which runner runs the job (``plan.runner_reason``), one per logger of ``io.loggers`` saying where the live
scalars go (``tensorboard --logdir RUN_DIR/tensorboard``; a tracker whose package is missing is refused before
anything starts) and calls that runner once
(:mod:`hpcrl.runtime.runners`: ``run(plan, run_dir, resume, progress) -> RunResult``):

- ``mpi`` (:mod:`~hpcrl.runtime.runners.mpiexec`): ``mpiexec`` with the right number of ranks,
  progress shown here, SIGINT/SIGTERM/SIGUSR1 forwarded as a graceful stop (the parameter rank
  checkpoints), ``launch.timeout_seconds`` enforced;
- ``serial`` (:mod:`~hpcrl.runtime.runners.serial`): every role in this process, same record;
- ``fused`` (:mod:`~hpcrl.runtime.runners.fused`): HA2C/HDDPG on a batched env as one device loop
  in this process, with the roles' checkpoints (``--resume`` goes on); ``--ranks`` is refused.

The result's one-line message (stopped, timed out, failed) goes to stderr and its exit code is
the command's. With ``--inside-mpi``, or when the process is already one rank of a multi-rank
job (srun, PBS mpiexec), it runs its role.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from hpcrl import launch, verbosity
from hpcrl.config import RunConfig, load_config
from hpcrl.errors import ConfigError
from hpcrl.io.run_lock import RunLock
from hpcrl.runtime.plan import Plan, make_plan
from hpcrl.runtime.record.loggers import describe, missing_package
from hpcrl.runtime.runners import RunResult, prestart, runner
from hpcrl.runtime.runners.prestart import PrestartServer
from hpcrl.runtime.runners.startup import process_start_unix, record_startup
from hpcrl.runtime.signals import EXIT_FINISHED, remember_stop_signals

CONFIG_FILE = "config.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config (default: hpcrl/configs/cartpole.yaml, CartPole-v1 on 4 ranks)")
    parser.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. -o aggregation.d=0.9 (repeatable)")
    parser.add_argument("--runner", choices=("mpi", "serial", "sim"),
                        help="where the roles run (sets launch.runner): MPI ranks, all in this process, or all in this "
                             "process in virtual time on launch.profile's cluster")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    parser.add_argument("--ranks", type=int, metavar="N",
                        help="total MPI ranks; the ranks beyond the parameter and learner ranks become actors")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="start more local ranks than launch.ranks_per_core x the cores allow")
    parser.add_argument("--inside-mpi", action="store_true",
                        help="this process is already one rank of the job (srun / PBS mpiexec): run its role")


def resolve_plan(args: argparse.Namespace, ranks_from: str = "--ranks") -> tuple[Plan, Path | None]:
    """The validated config's plan and, for --resume, the existing run directory. Writes nothing."""
    run_dir = None
    if args.resume:
        if args.config:
            raise ConfigError("--resume RUN_DIR takes the config from RUN_DIR; do not also name CONFIG")
        run_dir = Path(args.resume).resolve()
        if not (run_dir / CONFIG_FILE).is_file():
            raise ConfigError(f"--resume: {args.resume!r} is not a run directory (no {CONFIG_FILE})")
    overrides = [*args.overrides, *([f"launch.runner={args.runner}"] if getattr(args, "runner", None) else [])]
    args = argparse.Namespace(**{**vars(args), "overrides": overrides})
    cfg = load_config(run_dir / CONFIG_FILE if run_dir else args.config, args.overrides)
    plan = make_plan(cfg)
    if plan.runner == "fused" and args.ranks is not None:
        raise ConfigError(f"--ranks: not supported by the fused loop (algo.name={cfg.algo.name} on a batched env "
                          "with one actor and one learner group runs in this process)")
    if run_dir is not None:
        from hpcrl.runtime.record.checkpoint import checkpoint_path, has_checkpoint

        if not has_checkpoint(run_dir):
            raise ConfigError(f"--resume: {args.resume!r} has no checkpoint ({checkpoint_path(run_dir)})")
        if cfg.aggregation.shards > 1:
            raise ConfigError(f"--resume: aggregation.shards={cfg.aggregation.shards} runs are not resumable yet (each "
                              "shard's optimizer state stays on its rank; the checkpoint holds the weights only)")
    if args.ranks is not None:
        try:
            actors = cfg.actors_for(args.ranks, ranks_from)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        cfg = load_config(run_dir / CONFIG_FILE if run_dir else args.config,
                          [*args.overrides, f"actors.count={actors}"])
        plan = make_plan(cfg)
    if run_dir is not None:
        check_resume_changes(load_config(run_dir / CONFIG_FILE), cfg)
    if (why := missing_package(cfg.io.loggers)) is not None:
        raise ConfigError(why)
    validate(plan)
    return plan, run_dir


RESUMABLE = ("stop.", "io.flush_seconds", "io.checkpoint_every", "io.checkpoint_min_seconds", "io.log_seconds",
             "io.loggers", "launch.", "eval.", "debug.", "actors.count", "learners.elastic_headroom",
             "learners.elastic_seconds")
"""Settings a resumed run may change; every other one is part of the state the checkpoint holds."""


def check_resume_changes(before: RunConfig, after: RunConfig) -> None:
    """ConfigError naming the first changed setting that the checkpoint's state depends on."""
    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) and k != "kwargs" else {f"{prefix}{k}": v})
        return out

    old, new = flat(before.model_dump(mode="json")), flat(after.model_dump(mode="json"))
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key) and not key.startswith(RESUMABLE):
            raise ConfigError(f"--resume: {key} would change from {old.get(key)!r} to {new.get(key)!r}, but the "
                              f"checkpoint was made with the first; a resumed run may change only "
                              f"{', '.join(k + '*' if k.endswith('.') else k for k in RESUMABLE)}")


def validate(plan: Plan) -> None:
    """Checks of the plan's config that need more than the config schema: env id, rank plan, algorithm."""
    from hpcrl.envs import check_env_id
    from hpcrl.runtime.topology import plan_roles

    cfg = plan.sections
    if plan.runner == "fused":
        from hpcrl.runtime.runners.fused import check_config

        check_config(cfg)
        return
    check_env_id(cfg.env.id, cfg.env.imports)  # env.imports first: they register a user's own ids
    from hpcrl.runtime.roles.env_backends import env_kind

    # actors step every kind (gym; batched on the CPU; parallel, agents = instances). Building one env
    # (copy) checks the rest: batched kwargs, one space shared by all agents, rescalable actions.
    if env_kind(cfg.env.id) != "gym" or cfg.env.rescale_actions:
        from hpcrl.runtime.roles.sampler import describe_env

        info = describe_env(cfg.env)
        if getattr(cfg.algo, "agents", None) is not None:
            from hpcrl.marl.agents import check_agent_count

            check_agent_count(cfg, info)  # a wrong count that divides the real one would pass silently
    plan_roles(plan.num_ranks, cfg.learners.groups, cfg.learners.launched_ranks_per_group, cfg.actors.count,
               plan.shards)
    if plan.shards > 1:
        from hpcrl.runtime.runners.shard_check import check_shards

        check_shards(plan)
    for setting, how in (("learners.elastic", cfg.learners.elastic), ("actors.elastic", cfg.actors.elastic)):
        if how != "park":
            from hpcrl.join_launch import joining_refused

            if (why := joining_refused(how, os.environ, setting)) is not None:
                raise ConfigError(why)
    if cfg.learners.allreduce == "horovod":
        from hpcrl.runtime.transport.group_reduce import horovod_available

        if not horovod_available():
            raise ConfigError("learners.allreduce: horovod is not installed in this Python (docs/runtime.md shows "
                              "how to build it); allowed here: auto")
    if cfg.launch.container is not None:
        from hpcrl.launch_container import container_prefix

        container_prefix(cfg.launch.container)  # image and binds checked before the run directory exists
    if cfg.debug.raise_on_rank is not None and cfg.debug.raise_on_rank >= plan.num_ranks:
        raise ConfigError(f"debug.raise_on_rank: {cfg.debug.raise_on_rank} is not a rank of a "
                          f"{plan.num_ranks}-rank job (allowed: 0..{plan.num_ranks - 1})")


def create_run_dir(plan: Plan) -> Path:
    """Make the run directory of the plan's config (never reusing one) and write its resolved config.yaml."""
    cfg = plan.sections
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.io.run_dir.format(name=cfg.name, time=stamp)).resolve()
    path, n = base, 1
    try:
        while True:
            try:
                path.mkdir(parents=True, exist_ok=False)
                break
            except FileExistsError:
                n += 1
                path = base.with_name(f"{base.name}-{n}")
        tmp = path / (CONFIG_FILE + ".tmp")
        tmp.write_text(cfg.yaml)
        os.replace(tmp, path / CONFIG_FILE)
    except OSError as exc:
        raise ConfigError(f"io.run_dir: cannot create {path} ({exc.strerror or exc}); "
                          "pick a writable place with -o io.run_dir=PATH") from None
    return path


RESUMES_COLLECTION = True
"""The runner resumes Python's garbage collector once its roles are built, not hpcrl.cli (runtime/collector.py)."""


def main(args: argparse.Namespace) -> int:
    remember_stop_signals()  # a cancel during start-up ends the run cleanly as a cancel
    inside = launch.job_rank(os.environ)
    if args.inside_mpi or inside is not None:
        from hpcrl.runtime.runners.mpi import start_inside_job

        if args.ranks is not None and inside is not None and inside[1] and inside[1] != args.ranks:
            raise ConfigError(f"--ranks {args.ranks}: this job has {inside[1]} ranks")
        plan = resolve_plan(args)[0]  # every mistake is reported before MPI starts
        if plan.runner != "mpi":
            raise ConfigError(f"launch.runner={plan.runner} runs in one process, not as ranks of an MPI job; "
                              "start `hpcrl run CONFIG` once, without mpiexec, srun or --inside-mpi")

        def plan_for(size: int) -> Plan:
            """The plan for a job of ``size`` ranks: the ranks beyond parameter + learners are actors."""
            nonlocal plan
            plan = resolve_plan(argparse.Namespace(**{**vars(args), "ranks": size}), "MPI job size")[0]
            return plan

        run_dir = Path(args.resume).resolve() if args.resume else None
        return start_inside_job(plan_for, run_dir, resume=run_dir is not None,
                                make_run_dir=lambda: create_run_dir(plan), progress=progress_mode()).exit_code
    command_unix = getattr(args, "command_unix", None) or process_start_unix()
    # the ranks' libraries are imported by the prestart server while this process checks the config
    server = start_prestart() if args.runner not in ("serial", "sim") else None
    job_ran = False
    try:
        plan, run_dir = resolve_plan(args)
        cfg = plan.sections
        check_local_machine(plan, oversubscribe=args.oversubscribe)
        if server is not None and not uses_prestart(plan):
            server.stop(wait=0)
            server = None
        if args.config is None and run_dir is None:
            verbosity.say("hpcrl run: no CONFIG given: the default job, hpcrl/configs/cartpole.yaml", flush=True)
        if run_dir is None:
            run_dir = create_run_dir(plan)
        verbosity.say(f"hpcrl run: {plan.runner_reason}, run directory {run_dir}", flush=True)
        for logger in cfg.io.loggers:
            verbosity.say(f"hpcrl run: live scalars: {describe(logger, run_dir, cfg.name)}", flush=True)
        if verbosity.level() >= verbosity.VERBOSE:
            for line in plan_lines(plan, run_dir if args.resume else None):
                print(f"hpcrl run: {line}", flush=True)
        with RunLock(run_dir):  # one run or resume of a directory at a time
            if args.resume and (args.overrides or args.ranks is not None or args.runner):
                from hpcrl.runtime.record.checkpoint import load_checkpoint

                load_checkpoint(run_dir)  # CheckpointError (one line) before config.yaml takes the new values
                (run_dir / CONFIG_FILE).write_text(cfg.yaml)  # the resumed run continues with the new values
            ranks = {"environ": server.environ} if server is not None else {}  # the mpi runner's ranks
            result = runner(plan.runner).run(plan, run_dir, resume=args.resume is not None, progress=progress_mode(),
                                             **ranks)
            job_ran = True
            if plan.runner != "sim":  # a simulated job's record is in virtual time: no real start-up to measure
                report_startup(run_dir, command_unix, show=result.exit_code == EXIT_FINISHED)
            return finish(result)
    finally:
        if server is not None:  # after a job its children have ended; before one (a mistake) nothing waits
            server.stop(wait=10.0 if job_ran else 0.0)


def plan_lines(plan: Plan, resume_dir: Path | None) -> list[str]:
    """What ``hpcrl -v run`` adds at start: the plan's sizes and, for a resume, the checkpoint it goes on from."""
    cfg = plan.sections
    lines = [f"plan: {cfg.algo.name} on {cfg.env.id} x {cfg.env.num_envs} per actor; "
             + ("one device loop, " if plan.runner == "fused" else
                f"{plan.actors} actor(s), {plan.groups} learner group(s) of {cfg.learners.ranks_per_group} rank(s)"
                + {"park": "", "steps": " (joining as job steps)", "jobs": " (joining as batch jobs)"}[cfg.learners.elastic]
                + ", ")
             + f"fragments of {plan.fragment_steps} steps, rounds of {plan.round_steps} steps, "
             f"{plan.push} push, learners.device={cfg.learners.device}"]
    if resume_dir is not None:
        from hpcrl.runtime.record.checkpoint import checkpoint_path, load_checkpoint

        state = load_checkpoint(resume_dir) or {}
        lines.append(f"resuming from {checkpoint_path(resume_dir)}: version {state.get('version')}, "
                     f"{state.get('env_steps')} env steps, {state.get('wall_seconds', 0.0):.1f} s so far")
    return lines


def progress_mode() -> str:
    """How this process shows progress: a bar on a terminal, plain lines otherwise."""
    return "tty" if sys.stdout.isatty() else "plain"


def finish(result: RunResult) -> int:
    """The exit code of a run; why it did not end by its stop rule goes to stderr, one line (after a traceback)."""
    if result.details:
        print(result.details, file=sys.stderr, end="")
    if result.message:
        print(f"hpcrl run: {result.message}", file=sys.stderr)
    return result.exit_code


def start_prestart() -> PrestartServer | None:
    """The prestart server for this run's ranks (the one hpcrl.cli started as the command began, if it did), or None
    when it cannot start (the ranks then import for themselves)."""
    early = prestart.adopt_early()
    if early is not None:
        return early
    try:
        return PrestartServer(launch.rank_environment(os.environ))
    except OSError as exc:
        print(f"hpcrl run: no prestart server ({exc}); every rank imports its libraries itself", file=sys.stderr)
        return None


def uses_prestart(plan: Plan) -> bool:
    """True when the ranks of this local run are forked from a prestart server (hpcrl.runtime.runners.prestart)."""
    launch_cfg = plan.sections.launch
    return plan.runner == "mpi" and launch_cfg.prestart and launch_cfg.container is None


def report_startup(run_dir: Path, command_unix: float, show: bool = True) -> None:
    """Record the seconds from the command to the first environment step (run.h5 startup_seconds); print them
    when ``show`` (not after a failure, whose message stays the last line)."""
    seconds = record_startup(run_dir, command_unix)
    if seconds is not None and show and verbosity.level() >= verbosity.NORMAL:
        print(f"hpcrl run: first environment step {seconds:.2f} s after the command "
              "(run.h5 attribute startup_seconds)", flush=True)


def check_local_machine(plan: Plan, oversubscribe: bool = False) -> None:
    """What a local launch needs of this machine: not too many ranks per core, a GPU if learners.device=cuda,
    mpiexec for the mpi runner. A simulated job (launch.runner=sim) runs its ranks in virtual time on its
    profile's nodes, one thread of this process at a time: nothing to check here."""
    cfg = plan.sections
    if plan.runner == "sim":
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ranks = 1 if plan.runner == "fused" else plan.num_ranks
    limit = cfg.launch.ranks_per_core * cores
    if ranks > limit and not oversubscribe:
        raise ConfigError(f"actors.count: {ranks} ranks on {cores} cores is more than launch.ranks_per_core="
                          f"{cfg.launch.ranks_per_core:g} per core ({limit:g}); use fewer actors, raise "
                          "launch.ranks_per_core, or pass --oversubscribe")
    if cfg.learners.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("learners.device: cuda, but torch sees no CUDA device on this machine; "
                              "allowed here: auto, cpu")
    if plan.runner == "mpi":
        launch.find_mpiexec(cfg.launch)  # before the run directory exists
