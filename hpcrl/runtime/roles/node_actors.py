"""The actor ranks of one simulated node as one role (``launch.runner: sim`` with ``launch.sim_actors: node``).

Why: simulated rank by rank, every actor rank costs the simulating process a thread, a model, a sampler and an
open trajectory file (about 2 MB: the 60,000 actor ranks of a 1,000-node job would need 120 GB), its real
environment steps and policy passes at batch ``env.num_envs``, and, while the parameter rank is the bottleneck,
a wake every few virtual milliseconds to look for room in a learner group. Here the k actor ranks of a node run
in lockstep in one thread:

1. each rank pulls the newest weights when a version it has not seen is published (the node pays k fetches
   and rank 0's link carries k copies, as for k ranks; the node acts with the newest of them);
2. one sampler steps the node's k x ``env.num_envs`` environments with one model, in one batch; the node is
   charged one rank's fragment of env steps and trajectory writes (its k ranks step on k cores at once);
3. each rank's slice of the batch (its ``env.num_envs`` environments) goes out as that rank's fragment: its
   own link to the learners, its own choice of the least-backlogged group and wait for room, its fragment
   number, its report with its episodes, as :class:`hpcrl.runtime.roles.actor.Actor` sends one.

What this changes against the ranks one by one (docs/sim.md says it too): the node's ranks sample with one
version at one virtual time and straggle together (one draw per node, the profile's stragglers per node); the
environments are seeded from the node's first rank (``env.seed + 1000 x rank + i`` over the k x N); observation
and reward normalisation are the node's; and nothing is written to ``traj/``: a study of scale keeps the
record's tables (episodes, fragments, gradients, updates), not 60,000 trajectory files, so such a run cannot be
resumed. The node that holds the last actor rank runs the evaluation episodes (``eval.episodes``) as that rank
would, between two of its fragments. Refused at load (one line): ``actors.on_policy``, ``actors.weight_sync: aaps``;
actor parking (an algorithm's actor scaling) ends the run with a one-line error when it reaches the node.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hpcrl.runtime.clock import Work
from hpcrl.runtime.messages import Evaluation, FragmentReport
from hpcrl.runtime.roles.actor import (ActorSettings, action_seed, groups_with_room, least_backlogged_group,
                                       wait_for_groups)
from hpcrl.runtime.roles.evaluation import Evaluator
from hpcrl.runtime.roles.sampler import VectorSampler
from hpcrl.runtime.transport import control

# the fragment's arrays with one row per environment after the time axis ([T, N, ...]) and without it ([N, ...])
_PER_STEP = ("obs", "actions", "rewards", "terminated", "truncated", "behaviour_logp", "values", "final_values")
_PER_ENV = ("last_value", "last_obs")


class NodeActors:
    """Actor indices ``actors`` (one node's ranks) in lockstep; ``job`` is the Job of the node's first rank."""

    def __init__(self, job, settings: ActorSettings, actors: list[int]) -> None:
        self.job, self.settings, self.plan = job, settings, job.plan
        self.actors = list(actors)
        self.model, self.algo, self.clock = job.model, job.algo, job.clock
        self.envs_per_actor = settings.env.num_envs
        node_env = settings.env.model_copy(update={"num_envs": len(self.actors) * settings.env.num_envs})
        self.sampler = VectorSampler(node_env, self.actors[0], gamma=self.plan.reward_gamma, clock=job.clock)
        if hasattr(self.model, "sampling_generator"):
            self.model.sampling_generator = torch.Generator().manual_seed(action_seed(self.plan.seed, self.actors[0]))
        ranks = job.topo.actor_ranks
        self.heartbeats = [control.Heartbeat(job.counters, self.plan.groups, ranks[a], job.clock) for a in self.actors]
        self.links = [job.fragments.actor_link(a) for a in self.actors]
        self.version = -1
        self.weights = np.empty(self.model.flat.num_params, dtype=np.float32)
        self.fragments = [0] * len(self.actors)
        evaluates = settings.eval.episodes > 0 and self.plan.actors - 1 in self.actors  # the last actor evaluates
        self.evaluator = Evaluator(settings.env, settings.eval, self.sampler) if evaluates else None
        self.evaluated_rounds = 0

    def run(self) -> None:
        counters, clock, reports = self.job.counters, self.clock, self.job.reports
        T, E = self.plan.fragment_length, self.envs_per_actor
        G = self.plan.postprocess_groups or self.plan.groups
        choose_every = self.plan.fragments_to_every_group
        stopping = False
        while not stopping:
            self._beat()
            words = counters.read_all()
            if words[control.STOP]:
                break
            if self.evaluator is not None and words[control.EVAL] > self.evaluated_rounds:
                self._evaluate(int(words[control.EVAL]))
            if words[control.ACTIVE_ACTORS] <= self.actors[-1]:  # the node's indices ascend
                raise RuntimeError(f"actors {self.actors[0]}..{self.actors[-1]}: actor parking (ACTIVE_ACTORS="
                                   f"{int(words[control.ACTIVE_ACTORS])}) is not simulated with "
                                   "launch.sim_actors=node; use launch.sim_actors=rank")
            t = clock.now()
            t_sync = clock.now() - t if self._sync_weights() else 0.0
            t = clock.now()
            clock.did(Work.ENV_STEPS, T * E)  # the node's k ranks step on k cores at once: one rank's time
            batch, episodes = self.sampler.sample(self.algo, self.model, T, self.version, self.actors[0])
            t_sample = clock.now() - t  # the sampling alone, as an actor rank reports it
            clock.did(Work.RECORD, T * E)  # what each rank's trajectory write would take (nothing is written)
            mine = self._episodes_by_actor(episodes)
            normalizer = self.sampler.normalizer_state()  # the node's, in each rank's report
            for j, actor in enumerate(self.actors):
                t = clock.now()
                groups = self._wait_for_room(j, G, choose_every)
                if groups is None:
                    stopping = True
                    break
                for g in groups:
                    counters.add(control.BACKLOG + g, 1)
                t_wait = clock.now() - t
                fragment = self._slice(batch, j)
                fragment.update(policy_version=self.version, fragment=self.fragments[j], actor=actor)
                for g in groups:
                    t_wait += self.links[j].send(g, fragment)
                counters.add(control.ENV_STEPS, T * E)
                reports.send(FragmentReport(
                    time=clock.unix(), actor=actor, fragment=self.fragments[j], steps=T * E, sample_seconds=t_sample,
                    transport_wait_seconds=t_wait, weight_sync_seconds=t_sync, policy_version=self.version,
                    group=groups[0] if len(groups) == 1 else -1, episodes=tuple(mine[j]),
                    normalizer=normalizer))
                self.fragments[j] += 1
        self._finish()

    def _beat(self) -> None:
        for heartbeat in self.heartbeats:
            heartbeat.beat()

    def _sync_weights(self) -> bool:
        """Each rank pulls the newest weights when one newer than the node's is published; True when pulled."""
        board = self.job.board
        v = board.read_latest(self.weights, have=self.version)
        if v < 0:
            raise RuntimeError("actor: the weight board has no published version")
        if v == self.version:
            return False
        for _ in self.actors[1:]:  # the node's other ranks pull too (each its copy, over rank 0's link)
            v = board.read_latest(self.weights, have=-1)
        self.model.flat.load_(self.weights)
        self.version = v
        return True

    def _evaluate(self, rounds: int) -> None:
        """The evaluation requested after ``rounds`` rounds: the last actor rank pulls the newest weights and plays
        the evaluation episodes (as an actor rank does), then the node acts on with the version it held. Its steps
        cost the node no virtual time: rank by rank, the node's other ranks go on sampling while the last one
        plays, and the lockstep would otherwise hold them all (the last rank's own fragments are not delayed: the
        one difference)."""
        newest = np.empty_like(self.weights)
        v = self.job.board.read_latest(newest)
        self.model.flat.load_(newest)
        episodes = self.evaluator.run(self.algo, self.model)
        self.job.reports.send(Evaluation(time=self.clock.unix(), round=rounds, policy_version=v,
                                         episodes=tuple(episodes)))
        self.evaluated_rounds = rounds
        if self.version >= 0:
            self.model.flat.load_(self.weights)

    def _wait_for_room(self, j: int, G: int, every_group: bool) -> list[int] | None:
        rotate = self.fragments[j] + self.actors[j]

        def least_backlogged(backlog, cap, _words):
            g = least_backlogged_group(backlog, cap, rotate)
            return None if g is None else [g]

        return wait_for_groups(self.job, self.links[j], G, groups_with_room if every_group else least_backlogged,
                               self._beat)

    def _slice(self, batch: dict, j: int) -> dict:
        """Rank j's fragment: its environments' columns of the node's batch."""
        cols = slice(j * self.envs_per_actor, (j + 1) * self.envs_per_actor)
        out = {k: batch[k][:, cols] for k in _PER_STEP}
        out.update({k: batch[k][cols] for k in _PER_ENV})
        return out

    def _episodes_by_actor(self, episodes) -> list[list]:
        """The batch's finished episodes as each rank's (its actor index, its own environment index)."""
        out: list[list] = [[] for _ in self.actors]
        E = self.envs_per_actor
        for e in episodes:
            j = e.env_index // E
            out[j].append(dataclasses.replace(e, actor=self.actors[j], env_index=e.env_index % E))
        return out

    def _finish(self) -> None:
        """Complete every rank's pending sends, then say the node's ranks are done."""
        for link in self.links:
            link.close()
        self.job.reports.close()
        self.sampler.close()
        if self.evaluator is not None:
            self.evaluator.close()
        self.job.counters.add(control.ACTORS_DONE, len(self.actors))

    def close_on_error(self) -> None:
        pass
