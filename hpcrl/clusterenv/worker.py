"""A ClusterEnv worker: steps its share of the envs in one batch, for as long as its head lives.

Started by the head (``mpiexec -n W python -m hpcrl.clusterenv.worker --head HOST:PORT``), by a
batch job (``--rendezvous FILE``: wait for the head to write its address there), or as the other
ranks of the head's own MPI job (``--world``, or any rank but the head reaching ``ClusterEnv(...)``).
It connects its lifeline socket, joins the head's communicator, receives the setup (env id,
its env count, the policy factory: pickled once), builds its envs, and then answers commands
(:mod:`hpcrl.clusterenv.protocol`). It exits when the head says close, and by itself within
about a second when the head's lifeline socket closes (the head died).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from hpcrl.clusterenv import protocol as P
from hpcrl.clusterenv.infos import InfoEncoder
from hpcrl.clusterenv.lifeline import WorkerLifeline

HEAD_CHECK_SECONDS = 0.2
"""How often an idle worker checks that its head is still alive."""
"""How often an idle worker checks that its head is still alive."""


def make_envs(env_id: str, k: int, env_kwargs: dict, autoreset_mode: str):
    """This worker's ``k`` envs as one vector env: hpcrl's batched env, or a SyncVectorEnv of ``k`` copies."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from hpcrl.envs.registry import make, spec

    s = spec(env_id)
    if s is not None and s.kind == "batched":
        return s.load()(num_envs=k, device="cpu", **env_kwargs)
    mode = AutoresetMode[autoreset_mode.replace("-", "_").upper()]
    return SyncVectorEnv([lambda: make(env_id, **env_kwargs)] * k, autoreset_mode=mode)


def _numpy(x):
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _gym_infos(info: dict, k: int) -> dict:
    """hpcrl's batched envs give a dense final_obs tensor; Gymnasium gives an object array (None elsewhere)."""
    if "final_obs" not in info or np.asarray(_numpy(info["final_obs"])).dtype == object:
        return info
    dense, mask = _numpy(info["final_obs"]), _numpy(info["_final_obs"]).astype(bool)
    objs = np.full(k, None, dtype=object)
    for i in np.flatnonzero(mask):
        objs[i] = dense[i].copy()
    return {**info, "final_obs": objs, "_final_obs": mask}


class Worker:
    """One worker's envs, its result buffer and (worker-side inference) its cached policy."""

    def __init__(self, comm, setup: dict, ring=None):
        from mpi4py import MPI

        self.MPI, self.comm = MPI, comm
        self.ring = ring
        """Called just before each result goes out (the doorbell), or None (the head polls)."""
        self.index = comm.Get_rank() - 1
        self.k = setup["counts"][self.index]
        self.envs = make_envs(setup["env_id"], self.k, setup["env_kwargs"], setup["autoreset_mode"])
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.policy = None
        width = 0
        if setup.get("policy") is not None:
            from hpcrl.clusterenv.policy import describe, make_policy

            self.policy_module = make_policy(pickle.loads(setup["policy"]), obs_space, act_space)
            _, width, _ = describe(self.policy_module, obs_space)
        self.layout = P.result_layout(self.k, obs_space.shape, obs_space.dtype, act_space.shape, act_space.dtype, width)
        room = P.info_room(self.layout, self.k, int(np.prod(obs_space.shape)) * obs_space.dtype.itemsize)
        self.room = room
        self.buf = self.layout.empty(room)
        self.views = self.layout.views(self.buf)
        self.actions = np.zeros((self.k, *act_space.shape), dtype=act_space.dtype)
        self.encoder = InfoEncoder(self.k)
        self.obs = None
        self.steps = 0
        self.spaces = (obs_space, act_space)
        self.act_shape = act_space.shape

    def attach_board(self, board, kl_threshold: float) -> None:
        from hpcrl.clusterenv.policy import WorkerPolicy

        self.policy = WorkerPolicy(self.policy_module, board, self.spaces[1], kl_threshold)

    # ---- commands ---------------------------------------------------------------------
    def reset(self, payload: bytes) -> None:
        seed, options = pickle.loads(payload)
        if self.policy is not None:  # this worker's action sampling: its own stream, reproducible from the seed
            import torch

            first = seed if isinstance(seed, (int, type(None))) else seed[0]
            torch.manual_seed(int.from_bytes(os.urandom(4), "little") if first is None else 104729 + int(first))
        obs, info = self.envs.reset(seed=seed, options=options)
        self._send(obs, None, None, None, info)

    def step(self) -> None:
        obs, rew, term, trunc, info = self.envs.step(self.actions)
        self.steps += self.k
        self._send(obs, rew, term, trunc, info)

    def act(self, command: np.ndarray) -> None:
        if self.obs is None:
            raise RuntimeError("worker-side step before reset()")
        self.policy.maybe_sync(float(command[0]), int(command[1]))
        actions, logp, outs, env_actions = self.policy.act(self.obs)
        v = self.views
        v["actions"][...] = actions.reshape((self.k, *self.act_shape))
        v["logprob"][...] = logp
        v["outputs"][...] = outs
        self.step_actions = env_actions.reshape((self.k, *self.act_shape))
        obs, rew, term, trunc, info = self.envs.step(self.step_actions)
        self.steps += self.k
        self._send(obs, rew, term, trunc, info)

    def _send(self, obs, rew, term, trunc, info) -> None:
        MPI, v = self.MPI, self.views
        obs = _numpy(obs)
        self.obs = obs
        v["obs"][...] = obs
        v["rewards"][...] = 0.0 if rew is None else _numpy(rew)
        v["terminated"][...] = False if term is None else _numpy(term)
        v["truncated"][...] = False if trunc is None else _numpy(trunc)
        sid, new, data = self.encoder.encode(_gym_infos(info, self.k))
        if new is not None:
            self.comm.send(new, dest=0, tag=P.TAG_SCHEMA)
        inline = data.size <= self.room
        h = v["header"]
        h[:] = (sid, data.size, int(inline), self.policy.version if self.policy else -1,
                self.policy.syncs if self.policy else 0, self.steps)
        end = self.layout.nbytes
        if self.ring is not None:
            self.ring()
        if inline:
            self.buf[end:end + data.size] = data
            self.comm.Send([self.buf[:end + data.size], MPI.BYTE], dest=0, tag=P.TAG_RESULT)
        else:
            self.comm.Send([self.buf[:end], MPI.BYTE], dest=0, tag=P.TAG_RESULT)
            self.comm.Send([data, MPI.BYTE], dest=0, tag=P.TAG_INFO)

    def close(self) -> None:
        self.envs.close()


def _head_gone(comm) -> None:
    print(f"hpcrl.clusterenv worker {comm.Get_rank() - 1} on {socket.gethostname()}: the head is gone; exiting",
          file=sys.stderr, flush=True)
    os._exit(3)


def _wait_for_command(comm, lifeline, status, doorbell: bool) -> None:
    """Wait for the head's next command: asleep in select() until the head rings (doorbell), or polling
    MPI with sleeps of 10 us doubling to 1 ms; exit within HEAD_CHECK_SECONDS once the head is gone."""
    from mpi4py import MPI

    if doorbell:
        while True:
            rang = lifeline.wait_ring(HEAD_CHECK_SECONDS)
            if rang is None:
                _head_gone(comm)
            if rang:
                comm.Probe(source=0, tag=MPI.ANY_TAG, status=status)  # sent before the ring
                return
    delay, next_check = 1e-5, time.monotonic() + HEAD_CHECK_SECONDS
    while not comm.Iprobe(source=0, tag=MPI.ANY_TAG, status=status):
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)
        now = time.monotonic()
        if now >= next_check:
            next_check = now + HEAD_CHECK_SECONDS
            if lifeline is not None and lifeline.head_gone():
                _head_gone(comm)


def serve(comm, lifeline) -> None:
    """Receive the setup, build the envs, answer commands until TAG_CLOSE (collective with the head)."""
    from mpi4py import MPI

    setup = comm.bcast(None, root=0)
    torch_threads = setup.get("torch_threads")
    if torch_threads and setup.get("policy") is not None:
        import torch

        torch.set_num_threads(torch_threads)
    worker, error = None, None
    doorbell = setup["wait"] == "socket"
    try:
        worker = Worker(comm, setup, lifeline.ring if doorbell else None)
    except BaseException as exc:  # reported to the head, which raises it with this worker's name
        error = f"{type(exc).__name__}: {exc}"
    if torch_threads and "torch" in sys.modules:  # envs that run on torch (hpcrl's batched ones): no spinning pool
        sys.modules["torch"].set_num_threads(torch_threads)
    report = {"host": socket.gethostname(), "pid": os.getpid(), "error": error,
              "spaces": worker.spaces if worker else None}
    comm.gather(report, root=0)
    board = None
    if setup.get("policy") is not None:
        num_params = comm.bcast(None, root=0)
        if num_params > 0:
            from hpcrl.runtime.transport.windows import WeightBoard

            board = WeightBoard(comm, 0, num_params, history=2)
            worker.attach_board(board, setup["kl_threshold"])
        else:
            worker = None  # another worker failed: the head raises and closes the lifelines
    if worker is None:
        while True:
            _wait_for_command(comm, lifeline, MPI.Status(), doorbell)  # exits when the head is gone
            comm.recv(source=0, tag=MPI.ANY_TAG)
    status = MPI.Status()
    header = np.zeros(2, dtype=np.float64)
    while True:
        _wait_for_command(comm, lifeline, status, doorbell)
        tag = status.Get_tag()
        try:
            if tag == P.TAG_STEP:
                comm.Recv([worker.actions, MPI.BYTE], source=0, tag=P.TAG_STEP)
                worker.step()
            elif tag == P.TAG_ACT:
                comm.Recv([header, MPI.DOUBLE], source=0, tag=P.TAG_ACT)
                worker.act(header)
            elif tag == P.TAG_RESET:
                worker.reset(comm.recv(source=0, tag=P.TAG_RESET))
            elif tag == P.TAG_CLOSE:
                comm.recv(source=0, tag=P.TAG_CLOSE)
                worker.close()
                return _finish(comm, board)
            else:
                raise RuntimeError(f"unknown command tag {tag}")
        except Exception:
            if doorbell:
                lifeline.ring()
            comm.send(traceback.format_exc(limit=6), dest=0, tag=P.TAG_ERROR)


def _finish(comm, board) -> None:
    if board is not None:
        board.free()
    comm.Barrier()
    comm.Disconnect()


def connect(args) -> tuple:
    """Join the head: (merged communicator with the head at rank 0, lifeline)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if args.world:
        comm = world.Dup()
        address = comm.bcast(None, root=0)
        hello = {"worker": comm.Get_rank() - 1, "host": socket.gethostname(), "pid": os.getpid()}
        return comm, WorkerLifeline(address, hello, args.timeout)
    address = args.head or _rendezvous(Path(args.rendezvous), args.timeout)
    hello = {"worker": world.Get_rank(), "host": socket.gethostname(), "pid": os.getpid()}
    lifeline = WorkerLifeline(address, hello, args.timeout)
    inter = world.Connect(lifeline.port_name, root=0)
    comm = inter.Merge(high=True)
    inter.Free()
    return comm, lifeline


def _rendezvous(path: Path, timeout: float) -> str:
    """Wait for the head to write its lifeline address into ``path`` (a batch job that started first)."""
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise SystemExit(f"hpcrl.clusterenv worker: no head wrote {path} within {timeout:.0f} s")
        time.sleep(0.5)
    return json.loads(path.read_text())["lifeline"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcrl.clusterenv.worker", description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--head", help="HOST:PORT of the head's lifeline (the head started this job)")
    where.add_argument("--rendezvous", help="file the head writes its lifeline address into (batch jobs)")
    where.add_argument("--world", action="store_true", help="the head is rank 0 of this MPI job")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the head")
    args = p.parse_args(argv)
    comm, lifeline = connect(args)
    serve(comm, lifeline)
    lifeline.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
