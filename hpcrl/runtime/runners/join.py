"""Ranks that join a running job (hpcrl/join_launch.py, runtime/transport/joining.py): a learner group's other ranks
(``learners.elastic``) or an actor's sampler (``actors.elastic``, runtime/roles/joining_sampler.py).

``python -m hpcrl.runtime.runners.join RUN_DIR --group G --port-file F --ready-file R``, started by the
group's root as a job step of ``ranks_per_group - 1`` ranks (``--actor A --restart K``: by actor A
as one rank). Their first rank makes the Plan of ``RUN_DIR/config.yaml`` for all of them; they build the
model and algorithm as every rank does (a sampler its environments too), connect to the door's port (the first
rank writes R just before, so the door accepts only when they are there), merge into one communicator with the
door as rank 0, and serve it: the root's shares of each minibatch (the member loop of a launched group), or the
actor's fragments, until it releases them; then they disconnect and exit, and their step ends.

They touch no window of the job: the door beats for them, and a failure here ends only this step
(exit 1, traceback in the step's log, RUN_DIR/joins/): the door gives the join up or goes on alone.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcrl.runtime.runners.join", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--group", type=int, help="serve this learner group's root")
    who.add_argument("--actor", type=int, help="sample for this actor")
    parser.add_argument("--restart", type=int, default=0, help="--actor: samplers the actor had before this one")
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--root", default="", help="HOST:PID of the group's root: a joined rank on its host ends "
                        "when that process is gone (elsewhere the allocation's end ends the step)")
    args = parser.parse_args(argv)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        import torch

        from hpcrl.runtime.roles.learner import member_share
        from hpcrl.runtime.roles.sampler import describe_env
        from hpcrl.runtime.runners.job import learner_device, role_parts
        from hpcrl.runtime.runners.mpi import job_plan
        from hpcrl.runtime.runners.threads import one_compute_thread
        from hpcrl.runtime.transport.joining import JoinedReduce

        one_compute_thread()
        # this launch's first rank makes the Plan of the run's config once, and its env spaces, for all of them
        plan = job_plan(Path(args.run_dir)) if world.Get_rank() == 0 else None
        plan, env = world.bcast((plan, describe_env(plan.sections.env) if plan is not None else None), root=0)
        if args.actor is not None:  # a sampler: on the CPU, its environments made before it connects
            from hpcrl.runtime.roles.sampler import VectorSampler

            algo, model, _ = role_parts(plan, env, torch.device("cpu"))
            sampler = VectorSampler(plan.sections.env, args.actor, gamma=plan.reward_gamma, restart=args.restart)
        else:
            node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())  # the GPU of its index on its node
            algo, model, _ = role_parts(plan, env, learner_device(plan.sections.learners, node.Get_rank()))
            node.Free()
        port = Path(args.port_file).read_text()
        if world.Get_rank() == 0:
            tmp = Path(f"{args.ready_file}.tmp")
            tmp.write_text(f"{MPI.Get_processor_name()} {os.getpid()}")  # host and pid of the first joined rank
            os.replace(tmp, args.ready_file)
        inter = world.Connect(port, root=0)
        comm = inter.Merge(high=True)
        if args.actor is not None:
            from hpcrl.runtime.roles.joining_sampler import serve_sampler

            try:
                serve_sampler(comm, sampler, algo, model, args.actor, root_gone(args.root))
            finally:
                sampler.close()
        else:
            group = JoinedReduce(comm, root_gone(args.root))
            group.serve(member_share(algo, model, group), lambda: None)
        comm.Free()
        if world.Get_rank() == 0:  # the door disconnects only once this is there (a rank that died never will)
            Path(args.ready_file).with_suffix(".leaving").write_text("0")
        inter.Disconnect()
        if world.Get_rank() == 0:  # the root waits for this, not for the launcher (sbatch --wait polls for long)
            Path(args.ready_file).with_suffix(".left").write_text("0")
    except BaseException:  # noqa: BLE001 - this step only: the job goes on
        whose = f"group {args.group}" if args.actor is None else f"actor {args.actor}'s sampler"
        sys.stderr.write(f"[joined rank {world.Get_rank()} of {whose}] hpcrl: failed\n"
                         + traceback.format_exc())
        sys.stderr.flush()
        return 1
    return 0


def root_gone(root: str):
    """True once the root process (HOST:PID, on this host) is gone, so a job that was killed leaves no joined rank
    waiting for it (checked before each send and between polls; on another host the allocation's end ends the
    rank)."""
    from hpcrl.runtime.transport.joining import process_gone

    host, _, pid = root.rpartition(":")
    if not pid:
        return lambda: False
    return lambda: process_gone(host, int(pid))


if __name__ == "__main__":
    sys.exit(main())
