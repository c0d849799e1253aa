"""A joining learner group's other ranks (``learners.elastic: steps``, runtime/transport/joining.py).

``python -m hpcrl.runtime.runners.join RUN_DIR --group G --port-file F --ready-file R``, started by the
group's root as a job step of ``ranks_per_group - 1`` ranks. They read ``RUN_DIR/config.yaml``, build
the model and algorithm as every rank does, connect to the root's port (the first rank writes R just
before, so the root accepts only when they are there), merge into one communicator with the root as
rank 0, and serve the root's shares of each minibatch (the member loop of a launched group) until it
releases them; then they disconnect and exit, and their step ends.

They touch no window of the job: the root beats for the group, and a failure here ends only this step
(exit 1, traceback in the step's log, RUN_DIR/joins/): the root gives the join up or computes alone.
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
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--root", default="", help="HOST:PID of the group's root: a joined rank on its host ends "
                        "when that process is gone (elsewhere the allocation's end ends the step)")
    args = parser.parse_args(argv)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        import torch

        from hpcrl.config import load_config
        from hpcrl.runtime.roles.learner import member_share
        from hpcrl.runtime.roles.sampler import describe_env
        from hpcrl.runtime.runners.job import learner_device, role_parts
        from hpcrl.runtime.runners.mpi import CONFIG_FILE
        from hpcrl.runtime.transport.joining import JoinedReduce

        torch.set_num_threads(1)
        cfg = load_config(Path(args.run_dir) / CONFIG_FILE)
        env = describe_env(cfg.env) if world.Get_rank() == 0 else None
        env = world.bcast(env, root=0)
        node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())  # the GPU of its index on its node
        algo, model, _ = role_parts(cfg, env, None, learner_device(cfg.learners, node.Get_rank()))
        node.Free()
        port = Path(args.port_file).read_text()
        if world.Get_rank() == 0:
            tmp = Path(f"{args.ready_file}.tmp")
            tmp.write_text(f"{MPI.Get_processor_name()} {os.getpid()}")  # host and pid of the first joined rank
            os.replace(tmp, args.ready_file)
        inter = world.Connect(port, root=0)
        comm = inter.Merge(high=True)
        group = JoinedReduce(comm, root_gone(args.root))
        group.serve(member_share(algo, model, group), lambda: None)
        comm.Free()
        inter.Disconnect()
        if world.Get_rank() == 0:  # the root waits for this, not for the launcher (sbatch --wait polls for long)
            Path(args.ready_file).with_suffix(".left").write_text("0")
    except BaseException:  # noqa: BLE001 - this step only: the job goes on
        sys.stderr.write(f"[joined rank {world.Get_rank()} of group {args.group}] hpcrl: failed\n"
                         + traceback.format_exc())
        sys.stderr.flush()
        return 1
    return 0


def root_gone(root: str):
    """True once the root process (HOST:PID, on this host) is gone, so a job that was killed leaves no joined rank
    waiting for it (checked between polls; on another host the allocation's end ends the rank)."""
    import socket

    host, _, pid = root.rpartition(":")
    if not pid or host != socket.gethostname():
        return lambda: False

    def gone() -> bool:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        return False

    return gone


if __name__ == "__main__":
    sys.exit(main())
