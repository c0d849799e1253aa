"""ClusterEnv's options, checked before any process starts (each bad value: one line naming it)."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from hpcrl.errors import ConfigError

LAUNCHES = ("auto", "local", "world", "batch")
AUTORESET_MODES = ("same-step", "next-step", "disabled")


@dataclass
class ClusterOptions:
    env_id: str
    num_envs: int
    workers: int = 1
    """Worker ranks; the envs are split as evenly as possible (the first ones get one more)."""
    env_kwargs: dict = field(default_factory=dict)
    autoreset_mode: str = "same-step"
    """Gymnasium's AutoresetMode (value or name); hpcrl's batched envs support same-step only."""
    launch: str = "auto"
    """auto: world inside a multi-rank MPI job, else local; local: start mpiexec; world: the other ranks of
    this job; batch: submit a worker job to ``site`` (or attach to one through ``rendezvous``)."""
    timeout: float = 120.0
    """Seconds to wait for every worker to connect."""
    step_timeout: float | None = 600.0
    """Seconds ``reset()`` and ``step()`` wait for every worker's result before raising :class:`WorkerStalled`
    naming the workers that did not answer (a stopped or hung worker keeps its lifeline open); None: no limit.
    Raise it for envs slower than this per step."""
    mpiexec: str = "mpiexec"
    """local: the mpiexec to start workers with (a name is looked up next to python, then on PATH)."""
    mpiexec_args: list = field(default_factory=list)
    python: str = sys.executable
    host: str | None = None
    """The name workers reach the head by (default: 127.0.0.1 for local, the hostname otherwise)."""
    site: str | None = None
    """batch: an hpcrl site (hpcrl/sites/NAME.yaml) to submit the worker job to."""
    batch: dict = field(default_factory=dict)
    """batch: submit settings: nodes, time (HH:MM:SS), account, queue, job_dir."""
    rendezvous: str | None = None
    """batch: the file the head writes its address into; alone (no site): attach to a running worker job."""
    policy: object = None
    """Worker-side inference: a factory ``(single_obs_space, single_action_space) -> module with dist(obs)``,
    or "actor_critic" (hpcrl.models.ActorCritic, 64x64 tanh)."""
    kl_threshold: float = 0.05
    """AAPS delta: a worker pulls new weights when its mean KL(cached || head) exceeds it."""
    kl_window: int = 256
    """AAPS: states per worker in the running mean (its most recent ones)."""
    record: str | None = None
    """Path of an HDF5 file recording per-worker syncs, KL estimates and episodes (worker-side inference)."""
    torch_threads: int = 1
    """Torch threads per worker (worker-side inference, and envs that run on torch)."""
    head_threads: int | str | None = "auto"
    """The head's torch threads: "auto" (max(1, cores - workers on the head's host) when workers share it,
    else unchanged), an int, or None (leave torch's setting); restored at close (:mod:`hpcrl.clusterenv.threads`)."""
    wait: str = "socket"
    """How head and workers wait for each other: "socket" (sleep in select() on the lifeline until a one-byte
    doorbell: best where ranks share cores) or "poll" (poll MPI with short sleeps)."""

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ConfigError("env_id: must be a Gymnasium id or a registered hpcrl env id")
        if int(self.num_envs) < 1:
            raise ConfigError(f"num_envs: {self.num_envs} must be >= 1")
        if not 1 <= int(self.workers) <= int(self.num_envs):
            raise ConfigError(f"workers: {self.workers} must be between 1 and num_envs ({self.num_envs})")
        self.num_envs, self.workers = int(self.num_envs), int(self.workers)
        mode = getattr(self.autoreset_mode, "value", self.autoreset_mode)
        mode = {"SameStep": "same-step", "NextStep": "next-step", "Disabled": "disabled"}.get(str(mode), str(mode))
        if mode.replace("_", "-").lower() not in AUTORESET_MODES:
            raise ConfigError(f"autoreset_mode: {self.autoreset_mode!r}; allowed: {', '.join(AUTORESET_MODES)}")
        self.autoreset_mode = mode.replace("_", "-").lower()
        if self.launch not in LAUNCHES:
            raise ConfigError(f"launch: {self.launch!r}; allowed: {', '.join(LAUNCHES)}")
        if self.launch == "batch" and not (self.site or self.rendezvous):
            raise ConfigError("site: batch launch needs site=NAME (submit a worker job) or rendezvous=FILE (attach)")
        if not self.timeout > 0:
            raise ConfigError(f"timeout: {self.timeout} must be > 0 seconds")
        if self.step_timeout is not None and not (isinstance(self.step_timeout, (int, float))
                                                  and not isinstance(self.step_timeout, bool) and self.step_timeout > 0):
            raise ConfigError(f"step_timeout: {self.step_timeout!r} must be > 0 seconds or None (no limit)")
        if not self.kl_threshold >= 0:
            raise ConfigError(f"kl_threshold: {self.kl_threshold} must be >= 0")
        if int(self.kl_window) < 1:
            raise ConfigError(f"kl_window: {self.kl_window} must be >= 1")
        if not (self.head_threads in (None, "auto") or (isinstance(self.head_threads, int)
                                                          and not isinstance(self.head_threads, bool)
                                                          and self.head_threads >= 1)):
            raise ConfigError(f"head_threads: {self.head_threads!r}; allowed: 'auto', an int >= 1, or None")
        if int(self.torch_threads) < 1:
            raise ConfigError(f"torch_threads: {self.torch_threads} must be >= 1")
        if self.wait not in ("socket", "poll"):
            raise ConfigError(f"wait: {self.wait!r}; allowed: socket, poll")
        if self.record is not None and self.policy is None:
            raise ConfigError("record: the AAPS record needs worker-side inference (policy=...)")

    def resolved_launch(self, environ=os.environ) -> str:
        if self.launch != "auto":
            return self.launch
        from hpcrl.launch import job_rank

        return "world" if job_rank(environ) is not None else "local"
