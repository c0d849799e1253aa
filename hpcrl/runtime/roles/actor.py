"""An actor rank's loop: refresh the policy, sample a fragment, send it, record it.

Per fragment: pull the newest weights from the weight board when the version changed
(``actors.weight_sync = every_fragment``) or when the policy's outputs on the shared probe
batch drifted by more than ``aaps_delta`` in KL (``aaps``); step the environments
``fragment_length`` times; pick the active learner group with the smallest backlog; wait
while every active group already holds ``max_backlog`` fragments (back-pressure: actors do
not run ahead of the learners) or while ``max_in_flight`` sends are pending; send it to that
group; append the fragment to ``traj/actor-NNNNN.h5``; report the episodes and timings to the
parameter rank in one small message. With ``actors.on_policy`` the actor first reserves a
place in a group's backlog (waiting while there is none), then pulls the weights and samples:
the parameter rank frees a batch's places once the version that holds its push is published, every
group's in one write (runtime/roles/freed_places.py), so each batch is sampled with the weights the
previous one made, and an actor's fragments reach the groups in one order whatever the timing. It takes
at most its share of a group's batch with one version of the weights (ceil(places / active actors):
one fragment when there is a place per actor), so a fast actor does not fill a slow one's place and
which fragments make a batch does not depend on timing. With MARL
policy learners (the plan's ``every_group`` routing) the fragment goes to every active group
that has room, or with a post-processing learner (``postprocess_first``) to it alone. The actor acts with ``job.algo.act``. The last actor also
runs the evaluation episodes the parameter rank requests (:mod:`hpcrl.runtime.roles.evaluation`).

Parking (actor scaling, MARLess section 4.4): an actor whose index is not below the ACTIVE_ACTORS
counter word blocks in ``counters.wait_until`` (50 ms naps under MPI, a condition variable in the
serial runner) between two fragments, keeping its environments as they are, until the word grows
or the run stops; the evaluating actor wakes for an evaluation request too and parks again after
it. A parked actor sends no fragment, so none of its parked time is charged; when the park ends it
reports its length and CPU seconds (run.h5 ``actor_parks``). With ``actors.elastic: steps | jobs`` the
environments are not on this rank: a joined sampler steps them while the actor is active and leaves when it
parks, so its node goes back (runtime/roles/joining_sampler.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hpcrl.config import ActorsConfig, DebugConfig, EnvConfig, EvalConfig, IOConfig
from hpcrl.io import TrajectoryWriter, traj_filename
from hpcrl.runtime.transport import control
from hpcrl.runtime.clock import Work
from hpcrl.runtime.messages import PARK_REASON, ActorParked, Evaluation, FragmentReport
from hpcrl.runtime.roles.evaluation import Evaluator
from hpcrl.runtime.roles.joining_sampler import JoiningSampler
from hpcrl.runtime.roles.sampler import VectorSampler, bootstrap_values


@dataclass(frozen=True)
class ActorSettings:
    """The config sections an actor owns."""

    env: EnvConfig
    actors: ActorsConfig
    """Weight sync, keeping a joined sampler."""
    eval: EvalConfig
    io: IOConfig
    """The trajectory file's compression and flushes."""
    debug: DebugConfig


class Actor:
    def __init__(self, job, settings: ActorSettings) -> None:
        self.job, self.settings, self.plan = job, settings, job.plan
        self.model, self.algo = job.model, job.algo
        self.index = job.topo.actor_index
        self.clock = job.clock
        self.fault = control.FaultInjector(self.settings.debug, job.rank, actor=self.index, clock=job.clock)
        self.heartbeat = control.Heartbeat(job.counters, self.plan.groups, job.rank, job.clock)
        if job.joiner is None:
            self.sampler = VectorSampler(self.settings.env, self.index, gamma=self.plan.reward_gamma, clock=job.clock,
                                         between_steps=job.between_steps)
        else:  # actors.elastic: a joined rank samples while this actor is active
            self.sampler = JoiningSampler(self.settings.env, self.index, self.plan.reward_gamma, job.env.num_envs,
                                          job.joiner, job.reports, lambda: int(job.counters.read(control.ACTIVE_ACTORS)),
                                          self.heartbeat.beat, self.settings.actors.keep_sampler_seconds)
        if hasattr(self.model, "sampling_generator"):  # this actor's own action draws: no other thread's draws
            self.model.sampling_generator = torch.Generator().manual_seed(action_seed(self.plan.seed, self.index))
        self.sender = job.fragments.actor_link(self.index)
        self.version = -1
        self.weights = np.empty(self.model.flat.num_params, dtype=np.float32)
        self.fragments = 0
        self.syncs = 0
        self.placed = np.zeros(self.plan.groups, dtype=np.int64)  # on-policy: places taken per group ...
        self.placed_version = -1  # ... with these weights
        evaluates = self.settings.eval.episodes > 0 and self.index == self.plan.actors - 1
        self.evaluator = Evaluator(self.settings.env, self.settings.eval, self.sampler) if evaluates else None
        self.evaluated_rounds = 0
        path = job.run_dir / traj_filename(self.index)
        flush = self.settings.io.flush_seconds
        if job.resume and path.is_file():
            self.writer = TrajectoryWriter.open_append(path, flush_seconds=flush)
        else:
            self.writer = TrajectoryWriter(path, job.traj_layout, self.settings.io.compression, actor=self.index,
                                           flush_seconds=flush)

    def run(self) -> None:
        # numbering goes on after a resume from what this actor's file holds: the resume's rollback left in the
        # actors table exactly the fragments the file holds (hpcrl.io.rollback), which may be fewer than rank 0's
        # fragment_next (reported fragments whose steps were never flushed; a deleted file starts again at 0)
        self.fragments = self.writer.committed // (self.plan.fragment_length * self.sampler.num_envs)
        saved = self.job.startup.normalizers
        if self.index < len(saved) and saved[self.index] is not None:  # a resume: the statistics go on
            self.sampler.load_normalizer_state(saved[self.index])
        G = self.plan.postprocess_groups or self.plan.groups  # a post-processing group takes every fragment
        counters = self.job.counters
        T = self.plan.fragment_length
        on_policy = self.plan.on_policy
        clock = self.clock
        while True:
            self.fault.check()
            self.heartbeat.beat()
            words = counters.read_all()
            if words[control.STOP]:
                break
            if self.evaluator is not None and words[control.EVAL] > self.evaluated_rounds:
                self._evaluate(int(words[control.EVAL]))
            if self.index >= words[control.ACTIVE_ACTORS]:
                self._park()
                continue
            self.sampler.ready()  # actors.elastic: a sampler joins first (seconds; no sampling time)
            self.fault.slow_down()  # debug.slow_actor
            t = clock.now()
            if on_policy:  # a place first, then the weights the learners made since it was freed
                groups = self._wait_for_room(G, reserve=True)
                if groups is None:  # stopping
                    break
                t_wait = clock.now() - t
                t = clock.now()
            t_sync = clock.now() - t if self._sync_weights() else 0.0
            t = clock.now()
            # charged before the steps are taken: an episode's time is then its fragment's end (the weights were
            # read at its start)
            clock.did(Work.ENV_STEPS, T * self.sampler.num_envs)
            fragment, episodes = self.sampler.sample(self.algo, self.model, T, self.version, self.index)
            t_sample = clock.now() - t
            if not on_policy:
                t = clock.now()
                groups = self._wait_for_every_group(G) if self.plan.fragments_to_every_group else self._wait_for_room(G)
                if groups is None:  # stopping
                    break
                t_wait = clock.now() - t
                for g in groups:
                    counters.add(control.BACKLOG + g, 1)
            fragment["policy_version"] = self.version
            fragment["fragment"] = self.fragments
            for g in groups:
                t_wait += self.sender.send(g, fragment)
            if on_policy:
                self._count_places(groups)
            group = groups[0] if len(groups) == 1 else -1
            steps = T * self.sampler.num_envs
            counters.add(control.ENV_STEPS, steps)
            self.writer.append_fragment(fragment["obs"], fragment["actions"], fragment["rewards"],
                                        fragment["terminated"], fragment["truncated"], fragment["behaviour_logp"],
                                        fragment["values"], self.version, bootstrap_values(fragment))
            self.writer.maybe_flush(clock.now())  # every io.flush_seconds of the job's time (virtual under sim)
            clock.did(Work.RECORD, steps)
            self.job.reports.send(FragmentReport(
                time=clock.unix(), actor=self.index, fragment=self.fragments, steps=steps, sample_seconds=t_sample,
                transport_wait_seconds=t_wait, weight_sync_seconds=t_sync, policy_version=self.version, group=group,
                episodes=tuple(episodes), normalizer=self.sampler.normalizer_state()))
            self.fragments += 1
        self._finish()

    def _sync_weights(self) -> bool:
        """Pull the newest weights if needed; True when they were pulled."""
        have = self.version  # -1 before the first pull: never the newest
        if self.settings.actors.weight_sync == "aaps" and self.version >= 0:
            if not self.job.probe_drifted(self.model):
                return False
            have = -1  # drifted: pull the newest, whatever its version
        v = self.job.board.read_latest(self.weights, have=have)
        if v < 0:
            raise RuntimeError("actor: the weight board has no published version")
        if v == have:  # nothing newer: nothing copied
            return False
        self.model.flat.load_(self.weights)
        self.version = v
        self.syncs += 1
        return True

    def _evaluate(self, rounds: int) -> None:
        """The evaluation requested after ``rounds`` rounds, with the newest weights."""
        v = self.job.board.read_latest(self.weights)
        self.model.flat.load_(self.weights)
        self.version = v
        episodes = self.evaluator.run(self.algo, self.model)
        self.clock.did(Work.ENV_STEPS, sum(e.length for e in episodes))
        self.job.reports.send(Evaluation(time=self.clock.unix(), round=rounds, policy_version=v, episodes=tuple(episodes)))
        self.evaluated_rounds = rounds

    def _park(self) -> None:
        """Block while this actor is parked (no stop, no evaluation request), then report the park."""
        clock = self.clock
        start, cpu = clock.unix(), clock.thread_time()
        counters, i = self.job.counters, self.index

        def awake(w) -> bool:
            return (bool(w[control.STOP]) or i < w[control.ACTIVE_ACTORS]
                    or (self.evaluator is not None and w[control.EVAL] > self.evaluated_rounds))

        while True:
            self._alive()
            self.sampler.parked(clock.unix() - start)  # actors.elastic: its joined sampler leaves (at once, or later)
            words = counters.read_all()
            if awake(words):
                break
            counters.wait_until(awake, timeout=1.0, nap=control.PARK_NAP_SECONDS)
        reason = "stopped" if words[control.STOP] else ("woken" if i < words[control.ACTIVE_ACTORS] else "evaluation")
        self.job.reports.send(ActorParked(
            time=clock.unix(), actor=i, parked_seconds=clock.unix() - start, cpu_seconds=clock.thread_time() - cpu,
            active_actors=int(words[control.ACTIVE_ACTORS]), reason=PARK_REASON[reason]))

    def _wait_for_room(self, G: int, reserve: bool = False) -> list[int] | None:
        """[the least-backlogged active group with room], waiting (sleeping) while there is none.

        ``reserve`` (actors.on_policy): take the place at once (the backlog counter counts it from
        now), so actors that see the same free place do not all sample for it."""
        def least_backlogged(backlog: np.ndarray, cap: int, words: np.ndarray) -> list[int] | None:
            if reserve:  # a group where this actor took its share with the weights it holds is full for it
                backlog = np.where(self._shares_taken(len(backlog), int(words[control.ACTIVE_ACTORS])), cap, backlog)
            g = least_backlogged_group(backlog, cap, self.fragments + self.index)
            if g is None:
                return None
            if not reserve or self.job.counters.add(control.BACKLOG + g, 1) < cap:
                return [g]
            self.job.counters.add(control.BACKLOG + g, -1)  # another actor took it first
            return None

        return self._wait_until(G, least_backlogged)

    def _count_places(self, groups: list[int]) -> None:
        if self.version != self.placed_version:
            self.placed[:] = 0
            self.placed_version = self.version
        self.placed[groups] += 1

    def _shares_taken(self, active: int, active_actors: int) -> np.ndarray:
        """actors.on_policy: whether this actor holds its share of each active group's batch, sampled with
        the weights it holds; newer published weights (a batch trained) give it a new share everywhere."""
        placed = self.placed[:active] if self.placed_version == self.version else np.zeros(active, dtype=np.int64)
        actors = max(1, min(active_actors, self.plan.actors))
        share = -(-self.job.places_reserved(actors) // actors)
        taken = placed >= share
        if taken.any() and self.job.board.latest_version() > self.version:
            return np.zeros(active, dtype=bool)
        return taken

    def _wait_for_every_group(self, G: int) -> list[int] | None:
        """Every active group with room (MARL policy learners: each trains its own policies on every
        fragment), waiting (sleeping) while none has any. A full group misses the fragment rather than
        hold the others back: under sync admission a group just activated waits for fragments while the
        others wait for its first gradient, with their backlogs full."""
        return self._wait_until(G, groups_with_room)

    def _wait_until(self, G: int, choose) -> list[int] | None:
        return wait_for_groups(self.job, self.sender, G, choose, self._alive)

    def _alive(self) -> None:
        """A sign of life while waiting; meanwhile a node's report relay passes its node's reports on."""
        self.heartbeat.beat()
        self.job.reports.poll()

    def _finish(self) -> None:
        """Complete every pending send (the learners drain until all actors are done), then say so."""
        self.sender.close()
        self.job.reports.close()
        self.writer.close()
        self.sampler.close()
        if self.evaluator is not None:
            self.evaluator.close()
        self.job.counters.add(control.ACTORS_DONE, 1)

    def close_on_error(self) -> None:
        try:
            self.writer.close()
        except Exception:
            pass


def least_backlogged_group(backlog: np.ndarray, cap: int, rotate: int) -> int | None:
    """The active group with the smallest backlog, None when it holds ``cap``; ties rotate by ``rotate`` (the
    actor and fragment numbers), so equal backlogs do not all send to group 0."""
    active = len(backlog)
    order = (np.arange(active) + rotate) % active
    g = int(order[np.argmin(backlog[order])])
    return None if backlog[g] >= cap else g


def groups_with_room(backlog: np.ndarray, cap: int, _words=None) -> list[int] | None:
    """Every active group whose backlog is below ``cap`` (MARL policy learners), None when there is none."""
    return np.flatnonzero(backlog < cap).tolist() or None


def wait_for_groups(job, sender, G: int, choose, beat) -> list[int] | None:
    """Read the counters until ``sender`` can take a fragment and ``choose(backlogs of the active groups, cap,
    the counter words)`` names the groups to send it to, sleeping (backing off) between reads; None when the run
    stops. ``beat``: the waiting role's heartbeat."""
    backoff = job.actor_nap()  # ends early on a change of the shared state under the serial runner
    cap = job.max_backlog
    while True:
        beat()
        words = job.counters.read_all()
        if words[control.STOP]:
            return None
        active = int(min(max(words[control.ACTIVE], 1), G))
        backlog = words[control.BACKLOG:control.BACKLOG + active]
        if sender.can_send() and (groups := choose(backlog, cap, words)):
            return groups
        backoff.sleep()


def action_seed(seed: int, actor: int) -> int:
    """The seed of actor ``actor``'s action draws (its own stream: the same draws under every runner)."""
    return (seed * 1_000_003 + 7_919 * (actor + 1)) % (2**63)
