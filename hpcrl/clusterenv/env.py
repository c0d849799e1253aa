"""``hpcrl.ClusterEnv``: a Gymnasium vector env whose copies run on MPI worker ranks (ClusterEnv, DETACH).

The head (the process that builds it) keeps the training loop; W workers each step their share
of the ``num_envs`` copies in one batch and send back one packed buffer per step
(:mod:`hpcrl.clusterenv.pool`). How the workers start: :mod:`hpcrl.clusterenv.connect`.

Autoreset: ``same-step`` by default, as Gymnasium's vector envs do it in that mode
(``AutoresetMode.SAME_STEP``): an env that terminates or truncates in ``step()`` is reset in the
same call, the returned observation is its new first one, and ``infos["final_obs"]`` (an object
array, ``None`` elsewhere) with mask ``infos["_final_obs"]`` holds the observation it ended in, and
``infos["final_info"]`` / ``infos["_final_info"]`` its last info. Gymnasium's own default,
``next-step``, and ``disabled`` are passed through to the workers' SyncVectorEnv (Gymnasium envs
only). ``reset(seed=s)`` seeds env i with s + i, exactly as SyncVectorEnv does, so a ClusterEnv and
``gym.make_vec(..., vectorization_mode="sync")`` with the same seed and actions step identically.

Worker-side inference (``policy=...``): ``step()`` without actions lets every worker act with its
cached copy of the policy; ``publish(module)`` puts the head's weights on the weight board and a
worker pulls them only when AAPS says so (:class:`~hpcrl.runtime.roles.aaps.VisitedStateAAPS`). The
actions taken, their log-probabilities and the acting policy's version come back in
``infos["actions"]``, ``infos["logprob"]`` and ``infos["policy_version"]``.
"""
from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from hpcrl.clusterenv.options import ClusterOptions
from hpcrl.clusterenv.pool import WorkerError, WorkerLost, WorkerPool, WorkerStalled
from hpcrl.clusterenv.protocol import split
from hpcrl.errors import ConfigError

__all__ = ["ClusterEnv", "WorkerError", "WorkerLost", "WorkerStalled"]


def _options(env_id, num_envs, workers, options) -> ClusterOptions:
    try:
        return ClusterOptions(env_id, num_envs, workers, **options)
    except TypeError:
        known = ", ".join(ClusterOptions.__dataclass_fields__)
        bad = next(k for k in options if k not in ClusterOptions.__dataclass_fields__)
        raise ConfigError(f"ClusterEnv: unknown option {bad!r}; allowed: {known}") from None


class ClusterEnv(VectorEnv):
    """``num_envs`` copies of ``env_id`` (any Gymnasium id or hpcrl env) on ``workers`` MPI ranks."""

    def __init__(self, env_id: str, num_envs: int, workers: int = 1, **options: Any):
        self.options = opts = _options(env_id, num_envs, workers, options)
        from hpcrl.envs.registry import check_env_id, spec

        check_env_id(env_id)
        s = spec(env_id)
        if s is not None and s.kind == "parallel":
            raise ConfigError(f"env_id: {env_id!r} is a multi-agent (PettingZoo) env; ClusterEnv takes single-agent envs")
        if s is not None and s.kind == "batched" and opts.autoreset_mode != "same-step":
            raise ConfigError(f"autoreset_mode: {env_id} supports same-step only")
        self.num_envs = opts.num_envs
        modes = {"same-step": AutoresetMode.SAME_STEP, "next-step": AutoresetMode.NEXT_STEP,
                 "disabled": AutoresetMode.DISABLED}
        self.metadata = {"autoreset_mode": modes[opts.autoreset_mode], "render_modes": []}
        self.render_mode = None
        self.closed = False
        self.link = None
        self.pool = None
        self.board = None
        self.launch = opts.resolved_launch()
        if self.launch == "world":
            self._serve_if_worker()
        self.link = self._connect()
        try:
            self._setup()
        except BaseException:
            self._teardown(collective=False)
            raise

    # ---- startup ----------------------------------------------------------------------------
    def _serve_if_worker(self) -> None:
        """In world mode every rank but 0 becomes a worker here and leaves the process when the head closes."""
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        if world.Get_size() != self.options.workers + 1:
            raise ConfigError(f"workers: {self.options.workers} workers need {self.options.workers + 1} ranks "
                              f"in this MPI job (it has {world.Get_size()})")
        if world.Get_rank() != 0:
            from argparse import Namespace

            from hpcrl.clusterenv.worker import connect, serve

            comm, lifeline = connect(Namespace(world=True, timeout=self.options.timeout))
            serve(comm, lifeline)
            raise SystemExit(0)

    def _connect(self):
        from hpcrl.clusterenv import connect as C

        o = self.options
        if self.launch == "local":
            from hpcrl.config import LaunchConfig
            from hpcrl.launch import find_mpiexec

            mpiexec = find_mpiexec(LaunchConfig(mpiexec=o.mpiexec), o.python)
            return C.connect_local(o.workers, mpiexec, list(o.mpiexec_args), o.python, o.timeout, o.host)
        if self.launch == "world":
            return C.connect_world(o.workers, o.timeout, o.host)
        from hpcrl.clusterenv.batch import connect_batch

        return connect_batch(o)

    def _setup(self) -> None:
        import pickle

        o, comm = self.options, self.link.comm
        counts = split(o.num_envs, o.workers)
        policy_bytes = None
        if o.policy is not None:
            policy_bytes = _pickle_factory(o.policy)
            self._policy_factory = pickle.loads(policy_bytes)
        setup = {"env_id": o.env_id, "env_kwargs": dict(o.env_kwargs), "counts": counts,
                 "autoreset_mode": o.autoreset_mode, "policy": policy_bytes,
                 "kl_threshold": o.kl_threshold, "torch_threads": o.torch_threads, "wait": o.wait}
        from hpcrl.clusterenv.policy import describe, make_policy

        width, num_params, discrete = 0, 0, True
        comm.bcast(setup, root=0)
        reports = comm.gather(None, root=0)[1:]
        failed = [(i, r) for i, r in enumerate(reports) if r["error"]]
        obs_space, act_space = reports[0]["spaces"] if not failed else (None, None)
        if policy_bytes is not None:
            if not failed:  # the head builds the module once to size the weight board
                num_params, width, discrete = describe(make_policy(self._policy_factory, obs_space, act_space),
                                                       obs_space)
            comm.bcast(num_params if not failed else -1, root=0)
            if not failed:
                from hpcrl.runtime.transport.windows import WeightBoard

                self.board = WeightBoard(comm, 0, num_params, history=2)
        if failed:
            i, r = failed[0]
            raise ConfigError(f"ClusterEnv: worker {i} (host {r['host']}, pid {r['pid']}) could not build "
                              f"{o.env_id}: {r['error']}")
        self.single_observation_space, self.single_action_space = obs_space, act_space
        from hpcrl.clusterenv.threads import HeadThreads

        self.head_threads = HeadThreads(o.head_threads, reports)  # workers on the head's cores: no spinning pool
        self.observation_space = batch_space(obs_space, o.num_envs)
        self.action_space = batch_space(act_space, o.num_envs)
        self.pool = WorkerPool(self.link, counts, reports, obs_space, act_space, width, doorbell=o.wait == "socket",
                               step_timeout=o.step_timeout)
        self._obs = None
        self.version = -1
        self.aaps = None
        if policy_bytes is not None:
            from hpcrl.runtime.roles.aaps import VisitedStateAAPS

            self.aaps = [VisitedStateAAPS(o.kl_threshold, o.kl_window, width, obs_space.shape, discrete)
                         for _ in counts]
            self.kl = np.zeros(o.workers)
            self.syncs = np.zeros(o.workers, dtype=np.int64)
            self.worker_versions = np.full(o.workers, -1, dtype=np.int64)
            self.recorder = None
            if o.record:
                from hpcrl.clusterenv.record import AAPSRecorder

                self.recorder = AAPSRecorder(o.record, o, counts)

    # ---- VectorEnv -----------------------------------------------------------------------------
    def reset(self, *, seed: int | list | None = None, options: dict | None = None):
        """Reset every env; ``seed`` s seeds env i with s + i (a list: one seed per env), as SyncVectorEnv."""
        self._check_open()
        n, offsets = self.num_envs, self.pool.offsets
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds = [None if seed is None else int(seed) + int(lo) for lo in offsets[:-1]]
        else:
            seed = list(seed)
            if len(seed) != n:
                raise ConfigError(f"reset: seed list has {len(seed)} entries for {n} envs")
            seeds = [seed[lo:hi] for lo, hi in zip(offsets[:-1], offsets[1:])]
        per_worker = []
        for lo, hi in zip(offsets[:-1], offsets[1:]):
            opt = dict(options or {})
            if "reset_mask" in opt:
                opt["reset_mask"] = np.asarray(opt["reset_mask"])[lo:hi]
            per_worker.append(opt or None)
        parts = self.pool.reset(seeds, per_worker)
        arrays, infos = self.pool.assemble(parts, ("obs",))
        self._obs = arrays["obs"]
        if self.aaps is not None and self.recorder is not None:
            self.recorder.reset_episodes(n)
        return arrays["obs"], infos

    def step(self, actions=None):
        """Step every env with ``actions`` (head-side inference), or with the workers' policy (``None``)."""
        self._check_open()
        if actions is None:
            return self._step_policy()
        space = self.single_action_space
        actions = np.ascontiguousarray(np.asarray(actions, dtype=space.dtype).reshape((self.num_envs, *space.shape)))
        parts = self.pool.step(actions)
        arrays, infos = self.pool.assemble(parts, ("obs", "rewards", "terminated", "truncated"))
        self._obs = arrays["obs"]
        return arrays["obs"], arrays["rewards"], arrays["terminated"], arrays["truncated"], infos

    def _step_policy(self):
        if self.aaps is None:
            raise ConfigError("step: actions=None needs worker-side inference (ClusterEnv(..., policy=...))")
        if self.version < 0:
            raise RuntimeError("ClusterEnv.step(): publish(module) the policy once before worker-side steps")
        if self._obs is None:
            raise RuntimeError("ClusterEnv.step(): call reset() first")
        acted_on = self._obs
        parts = self.pool.act(self.kl, self.version)
        arrays, infos = self.pool.assemble(parts, ("obs", "rewards", "terminated", "truncated", "actions", "logprob"))
        versions = np.empty(self.num_envs, dtype=np.int64)
        for i, ((lo, hi), p) in enumerate(zip(self.pool._slices(), parts)):
            v, syncs = int(p["header"][3]), int(p["header"][4])
            if v != self.worker_versions[i]:
                self.kl[i] = 0.0  # the estimate was for the copy it just replaced
            self.worker_versions[i], self.syncs[i] = v, syncs
            versions[lo:hi] = v
            self.aaps[i].observe(acted_on[lo:hi], p["outputs"], v)
        self._obs = arrays["obs"]
        infos["actions"], infos["logprob"], infos["policy_version"] = arrays["actions"], arrays["logprob"], versions
        if self.recorder is not None:
            self.recorder.step(arrays["rewards"], arrays["terminated"] | arrays["truncated"], versions)
        return arrays["obs"], arrays["rewards"], arrays["terminated"], arrays["truncated"], infos

    def publish(self, module) -> int:
        """Put ``module``'s weights on the board as the next version; estimate each worker's KL to it."""
        self._check_open()
        if self.aaps is None:
            raise ConfigError("publish: needs worker-side inference (ClusterEnv(..., policy=...))")
        import torch

        from hpcrl.clusterenv.policy import flat_parameters, outputs

        self.version += 1
        self.board.publish(self.version, flat_parameters(module))

        def newest(states):
            with torch.no_grad():
                return outputs(module.dist(torch.as_tensor(states)))

        for i, a in enumerate(self.aaps):
            self.kl[i] = a.estimate(newest) if self.worker_versions[i] >= 0 else 0.0
        if self.recorder is not None:
            self.recorder.publish(self.version, self.kl, self.syncs, self.worker_versions)
        return self.version

    def close(self, **kwargs) -> None:
        """Tell the workers to leave and wait for them; after a worker died, only the survivors are told; workers
        this head started (``launch="local"``) that did not answer within ``step_timeout`` are killed."""
        if self.closed:
            return
        self.closed = True
        if self.pool is not None and self.launch == "local":
            for pid in self.pool.stalled_pids():  # stopped or hung: they would never read the lifeline's end
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._teardown(collective=self.pool is not None and self.pool.broken is None)

    def _teardown(self, collective: bool) -> None:
        from hpcrl.clusterenv.connect import _stop

        link = self.link
        if link is None:
            return
        try:
            if collective and getattr(self, "recorder", None) is not None:
                self.recorder.publish(self.version, self.kl, self.syncs, self.worker_versions)  # final counts
            if collective:
                self.pool.close()
                if self.board is not None:
                    self.board.free()
                link.comm.Barrier()
                link.comm.Disconnect()
        finally:
            link.lifeline.close()  # any survivor sees end-of-file and exits
            if link.process is not None:
                try:
                    link.process.wait(10)
                except Exception:
                    _stop(link.process)
            for fn in link.cleanup:
                fn()
            if getattr(self, "recorder", None) is not None:
                self.recorder.close()
            if getattr(self, "head_threads", None) is not None:
                self.head_threads.restore()
            self.link = None

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("ClusterEnv is closed")

    @property
    def wait_seconds(self) -> float:
        """Seconds the head spent waiting for workers' results (transport + env time)."""
        return self.pool.wait_seconds if self.pool else 0.0

    def __repr__(self) -> str:
        return (f"ClusterEnv({self.options.env_id!r}, num_envs={self.num_envs}, workers={self.options.workers}, "
                f"launch={self.launch!r})")


def _pickle_factory(policy) -> bytes:
    """The policy factory, pickled once for the workers (cloudpickle: a factory defined in a script works)."""
    if policy == "actor_critic":
        from hpcrl.clusterenv.policy import actor_critic_factory

        policy = actor_critic_factory()
    if not callable(policy):
        raise ConfigError(f"policy: {policy!r}; allowed: a callable (obs_space, action_space) -> module, "
                          "or 'actor_critic'")
    try:
        import cloudpickle

        return cloudpickle.dumps(policy)
    except ImportError:
        import pickle

        return pickle.dumps(policy)
