"""An actor whose sampling joins the running job while the actor is active (``actors.elastic: steps | jobs``).

The actor's rank in the job's launch keeps the actor's loop (runtime/roles/actor.py: the counter words, the
weights, the backlog it waits on, the sends, its trajectory file, its reports, the evaluation episodes). What
takes the CPU, the environments and the policy's forward passes, runs on one joined rank instead: started the
first time the actor samples after it was woken (or at the start), through a
:class:`~hpcrl.runtime.transport.protocols.Joiner` (``hpcrl/join_launch.py``) as a learner group's joining ranks
are, as a job step on a node of the allocation that holds none of the job's own ranks (``steps``; a second
mpiexec on one machine) or as a one-node batch job (``jobs``). Per fragment the actor sends it the weights (when their version changed since the
last fragment) and gets back the fragment, its finished episodes and the normalisation statistics. When the
actor parks it releases the sampler: the joined rank closes its environments and leaves, its step (job) ends
and its node goes back to the allocation (the cluster).

A new sampler starts new episodes: the one in progress when the previous sampler left is cut where its last
fragment ended (that fragment bootstraps from its last observation's value, as every fragment does) and is no
episode row. The normalisation statistics go on: each new sampler starts from the newest. Each sampler of an
actor seeds its environments with how many the actor had before it, so a new one does not replay the first
episodes of the last.

A sampler that does not connect within ``actors.join_timeout_seconds`` (queued, dead), or whose launch ends while
the actor waits for a fragment, is given up: the actor samples on its own rank until it is parked and woken again
(a fragment lost with the sampler is sampled again there with the same weights: nothing was sent or written of
it). Each join, leave and given-up join is a row of run.h5's ``actor_joins``.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.messages import ELASTIC_ACTION, ELASTIC_REASON, SamplerEvent
from hpcrl.runtime.roles.sampler import VectorSampler
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.joining import JoinLost, sending
from hpcrl.runtime.transport.protocols import Joiner


class JoiningSampler:
    """:class:`~hpcrl.runtime.roles.sampler.VectorSampler`'s interface for an actor whose sampler joins and leaves."""

    def __init__(self, env_cfg, actor: int, gamma: float, num_envs: int, joiner: Joiner, reports,
                 active_actors: Callable[[], int], beat: Callable[[], None], keep_seconds: float = 0.0) -> None:
        self.env_cfg, self.actor, self.gamma, self.num_envs = env_cfg, actor, gamma, num_envs
        self.keep_seconds = keep_seconds  # actors.keep_sampler_seconds: a short park keeps the sampler
        self.joiner, self.reports, self.active_actors, self.beat = joiner, reports, active_actors, beat
        self.normalizer: dict | None = None  # the newest statistics (VectorSampler.normalizer_state)
        self.given_up = False  # this wake's join failed: the actor samples on its own rank until it parks
        self.samplers = 0  # samplers this actor had (joined and its own): the next one's environment seeds
        self._sent_version: int | None = None  # the weights the joined sampler holds
        self._local: VectorSampler | None = None  # the actor's own: evaluation's normalisation, a given-up join
        self._loaded: dict | None = None  # the statistics it holds

    # ---- VectorSampler's interface -------------------------------------------------------------
    def ready(self) -> None:
        """Before a fragment: a sampler joins unless one is here or this wake's join was given up."""
        if self.joiner.comm is None and not self.given_up:
            self._join()

    def sample(self, algo, model, T: int, version: int, actor: int) -> tuple[dict[str, np.ndarray], list[dict]]:
        self.ready()
        if self.joiner.comm is not None:
            try:
                return self._sample_there(model, T, version)
            except JoinLost:
                self._lost()
        local = self.local()
        fragment, episodes = local.sample(algo, model, T, version, actor)
        self.normalizer = self._loaded = local.normalizer_state()
        return fragment, episodes

    def normalizer_state(self) -> dict | None:
        return self.normalizer

    def load_normalizer_state(self, state: dict) -> None:
        self.normalizer = state

    def policy_obs(self, raw: np.ndarray) -> np.ndarray:
        return self.local().policy_obs(raw)

    def env_action(self, a: np.ndarray) -> np.ndarray:
        return self.local().env_action(a)

    def parked(self, seconds: float) -> None:
        """The actor has been parked this long: once that is ``keep_seconds``, release the joined sampler (its step
        ends); the next wake joins a new one (a wake before reuses it)."""
        if self.joiner.comm is not None and seconds >= self.keep_seconds:
            self._leave()
        self.given_up = False

    def close(self) -> None:
        if self.joiner.comm is not None:
            self._leave()
        if self._local is not None:
            self._local.close()

    # ---- the joined sampler ----------------------------------------------------------------------
    def local(self) -> VectorSampler:
        """The actor's own sampler (made when first needed) with the newest statistics."""
        if self._local is None:
            self._local = VectorSampler(self.env_cfg, self.actor, gamma=self.gamma, restart=self._next())
        if self.normalizer is not None and self._loaded is not self.normalizer:
            self._local.load_normalizer_state(self.normalizer)
            self._loaded = self.normalizer
        return self._local

    def _next(self) -> int:
        self.samplers += 1
        return self.samplers - 1

    def _join(self) -> None:
        role = ["--actor", str(self.actor), "--restart", str(self._next())]
        why, waited = self.joiner.join(role, self.beat)
        if why is not None:
            self.given_up = True
            self._event("join_given_up", why, waited)
            self.joiner.given_up(why, f"actor {self.actor}: its sampler", "the actor samples on its own rank until it "
                                 "is parked")
            return
        self._sent_version = None
        comm = self.joiner.comm
        try:
            sending(lambda: [comm.isend({"normalizer": self.normalizer}, dest=1, tag=control.TAG_WORK)],
                    self.joiner.lost)
        except JoinLost:  # died at once: the first fragment finds it lost
            pass
        self._event("joined", "job_step", waited)
        self.joiner.record_job(self.reports)

    def _sample_there(self, model, T: int, version: int) -> tuple[dict[str, np.ndarray], list[dict]]:
        comm, lost = self.joiner.comm, self.joiner.lost
        weights = None if version == self._sent_version else model.flat.numpy()
        sending(lambda: [comm.isend({"weights": weights, "version": version, "T": T}, dest=1, tag=control.TAG_WORK)],
                lost)
        reply = control.recv_polling(comm, 1, control.TAG_SHARE, Backoff(5e-5, 2e-3), abandon=lost)
        if reply is None:
            raise JoinLost("the actor's joined sampler ended")
        self._sent_version = version
        self.normalizer = reply["normalizer"]
        return reply["fragment"], reply["episodes"]

    def _lost(self) -> None:
        seconds = time.monotonic() - self.joiner.joined_at
        code = self.joiner.drop()
        self.given_up = True
        self._event("left", "join_ended", seconds)
        self.joiner.dropped(code, f"actor {self.actor}: its joined sampler",
                            "the actor samples on its own rank until it is parked")

    def _leave(self) -> None:
        seconds = time.monotonic() - self.joiner.joined_at
        try:
            sending(lambda: [self.joiner.comm.isend(None, dest=1, tag=control.TAG_WORK)], self.joiner.lost)
        except JoinLost:
            self._lost()
            return
        code = self.joiner.leave()
        self._event("left", "job_step" if code == 0 else "join_ended", seconds)

    def _event(self, action: str, reason: str, seconds: float) -> None:
        self.reports.send(SamplerEvent(time=time.time(), actor=self.actor, action=ELASTIC_ACTION[action],
                                       reason=ELASTIC_REASON[reason], seconds=seconds,
                                       active_actors=self.active_actors()))


def serve_sampler(comm, sampler: VectorSampler, algo, model, actor: int, lost: Callable[[], bool]) -> None:
    """The joined rank's loop: a fragment for each request of the actor (rank 0 of ``comm``), until it releases
    this sampler (None) or is gone (RuntimeError)."""
    backoff = Backoff(5e-5, 2e-3)
    start = control.recv_polling(comm, 0, control.TAG_WORK, backoff, abandon=lost)
    if start is None:
        raise RuntimeError("the actor is gone")
    if start["normalizer"] is not None:
        sampler.load_normalizer_state(start["normalizer"])
    while True:
        work = control.recv_polling(comm, 0, control.TAG_WORK, backoff, abandon=lost)
        if work is None:
            if lost():
                raise RuntimeError("the actor is gone")
            return
        if work["weights"] is not None:
            model.flat.load_(work["weights"])
        fragment, episodes = sampler.sample(algo, model, work["T"], work["version"], actor)
        reply = {"fragment": fragment, "episodes": episodes, "normalizer": sampler.normalizer_state()}
        sending(lambda: [comm.isend(reply, dest=0, tag=control.TAG_SHARE)], lost)
