"""The HDF5 record's schema, as data: every table, every column, its dtype, unit and meaning.

A run directory (DESIGN.md section 6)::

    RUN_DIR/config.yaml                 resolved config
    RUN_DIR/run.h5                      written by the parameter rank only (tables below)
    RUN_DIR/traj/actor-NNNNN.h5         one per actor, NNNNN = actor index (0-based, not the MPI rank)

``run.h5`` holds one group per table in :data:`TABLES` (equal-length 1-D datasets, one per
column) and a group ``trajectories/`` of virtual datasets over the actors' files (see
:mod:`hpcrl.io.run_file`). Times are seconds since the run started (the ``start_unix``
attribute of run.h5), so they keep growing across resumes. ``docs/hdf5-schema.md`` is
rendered from this module (``python -m hpcrl.io.schema > docs/hdf5-schema.md``); a test
keeps the two equal.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCHEMA_VERSION = 1
"""Bumped whenever a table, column, dtype or meaning changes."""

RUN_FILE = "run.h5"
TRAJ_DIR = "traj"


def traj_filename(actor: int) -> str:
    """Path of actor ``actor``'s trajectory file, relative to the run directory."""
    return f"{TRAJ_DIR}/actor-{actor:05d}.h5"


def numbered_files(folder: str | Path, stem: str) -> dict[int, Path]:
    """Number -> path of the files ``folder/STEM-NNNNN.h5`` that exist (traj/actor-, nodes/node-), in number
    order; other names there are left out."""
    folder, name = Path(folder), re.compile(rf"{re.escape(stem)}-(\d+)\.h5")
    found = {}
    for p in sorted(folder.glob(f"{stem}-*.h5")) if folder.is_dir() else ():
        m = name.fullmatch(p.name)
        if m:
            found[int(m.group(1))] = p
    return found


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    """numpy dtype string: f8, f4, i8, i4, i1, S64 ..."""
    unit: str
    meaning: str
    required: bool = False
    """Required columns must be given to Table.append; others default to the fill value."""
    codes: tuple[str, ...] = ()
    """For integer code columns: codes[i] names code i (stored as the dataset's 'codes' attribute)."""

    @property
    def fill(self):
        """Value written when an optional column is not given: NaN, -1 or b''."""
        return fill_value(self.dtype)


@dataclass(frozen=True)
class TableSpec:
    name: str
    meaning: str
    columns: tuple[Column, ...]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name!r} has no column {name!r}; columns: {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def _c(name, dtype, unit, meaning, required=False, codes=()):
    return Column(name, dtype, unit, meaning, required, tuple(codes))


ROLES = ("parameter", "learner", "actor")

GRADIENT_REASONS = (
    "admitted",        # 0: applied in an aggregation event
    "too_stale",       # 1: rejected by the admission policy (staleness over its hard bound)
    "nonfinite",       # 2: rejected: NaN or inf in the gradient
    "shutdown",        # 3: still queued when the run stopped
    "inactive_group",  # 4: discarded: the group was deactivated before it was admitted
)

ELASTIC_ACTIONS = (
    "activate",  # 0: the parameter rank activated a group
    "park",      # 1: the parameter rank parked a group
    "parked",    # 2: a group's report of a park it left (parked_seconds, cpu_seconds)
    "joined",    # 3: learners.elastic=steps/jobs: a group's other ranks joined (parked_seconds: the wait);
                 #    actors.elastic: an actor's sampler joined (actor_joins)
    "left",      # 4: ... they left and their step ended (parked_seconds: how long they were in the job)
    "join_given_up",  # 5: ... they did not connect (parked_seconds: how long the root waited)
)
ELASTIC_REASONS = (
    "supply_above_capacity",  # 0: actors' sampling rate above the active groups' capacity (+ headroom)
    "supply_below_capacity",  # 1: one group fewer would still have headroom
    "woken",                  # 2: the park ended with an activation
    "stopped",                # 3: the park ended with the run
    "policies_merged",        # 4: MARL policy learners: fewer policies than active groups (learner sharing)
    "policies_split",         # 5: MARL policy learners: more policies than active groups
    "job_step",               # 6: joined, or left cleanly, as a job step or job (learners.elastic, actors.elastic)
    "join_ended",             # 7: the joining step ended before its ranks connected, or left with an error
    "join_timeout",           # 8: the joining step's ranks did not connect within (learners|actors).join_timeout_seconds
    "scheduled",              # 9: debug.active_groups
)

SCHEDULERS = ("slurm", "pbs")  # the allocations table's scheduler codes

NEVER_CUT = ("allocations",)
"""Tables a resume does not cut back to its checkpoint: a batch job that ran was billed, whether or not its
work survived."""

PARK_REASONS = (
    "woken",       # 0: the park ended: the actor is active again
    "evaluation",  # 1: the evaluating actor woke for an evaluation request (it parks again after it)
    "stopped",     # 2: the park ended with the run
)

TABLE_LIST = (
    TableSpec("rank_map", "One row per MPI rank the run has had: its role and place (written at creation; a resume with more actors appends their ranks).", (
        _c("rank", "i4", "", "MPI rank in the job's communicator: 0 the parameter rank, then the learners, then the actors", True),
        _c("role", "i1", "code", "0 parameter, 1 learner, 2 actor", True, ROLES),
        _c("group", "i4", "", "learner group index (-1 for other roles)"),
        _c("index", "i4", "", "actor index (traj file number) or rank within the learner group; 0 for the parameter rank"),
        _c("node", "S64", "", "host name"),
        _c("world_rank", "i4", "", "the rank its launcher gave it (COMM_WORLD); differs from rank where "
           "launch.placement.roles=learners_first reordered the ranks by node"),
    )),
    TableSpec("updates", "One row per aggregation event on the parameter rank (Stellaris Section V-C).", (
        _c("time", "f8", "s", "time the update was applied, since run start", True),
        _c("version", "i8", "", "policy version after this update", True),
        _c("round", "i8", "", "training round (Stellaris k) the update belongs to", True),
        _c("num_gradients", "i4", "", "gradients applied together (H in Stellaris Eq. 4's aggregation)", True),
        _c("staleness_mean", "f4", "versions", "mean staleness of the applied gradients"),
        _c("staleness_max", "i4", "versions", "largest staleness among the applied gradients"),
        _c("threshold", "f4", "versions", "threshold beta_k in force (Stellaris Eq. 3); NaN when none (round 0, pure async)"),
        _c("lr", "f4", "", "base learning rate alpha_0"),
        _c("loss_mean", "f4", "", "mean training loss reported with the applied gradients"),
        _c("loss_min", "f4", "", "smallest loss among the applied gradients"),
        _c("loss_max", "f4", "", "largest loss among the applied gradients"),
        _c("active_groups", "i4", "", "active learner groups when the update was applied"),
        _c("aggregate_seconds", "f4", "s", "wall time spent combining gradients and stepping the optimizer"),
        _c("publish_seconds", "f4", "s", "wall time spent publishing the new weights on the weight board"),
    )),
    TableSpec("gradients", "One row per gradient the parameter rank received, admitted or not.", (
        _c("time", "f8", "s", "time the gradient was taken out of the mailbox, since run start", True),
        _c("group", "i4", "", "learner group that pushed it", True),
        _c("seq", "i8", "", "the group's sequence number (0, 1, 2 ...)", True),
        _c("base_version", "i8", "", "policy version the gradient was computed with", True),
        _c("staleness", "i4", "versions", "policy version at admission (or rejection) minus base_version"),
        _c("round", "i8", "", "training round when it was admitted or rejected"),
        _c("lr_scale", "f4", "", "alpha_c / alpha_0 applied to it (Stellaris Eq. 4); NaN if not admitted"),
        _c("samples", "i4", "steps", "environment steps the gradient was computed on"),
        _c("loss", "f4", "", "training loss the learner reported with it"),
        _c("admitted", "i1", "", "1 admitted and applied, 0 not", True),
        _c("reason", "i1", "code", "why (index into the codes attribute)", True, GRADIENT_REASONS),
        _c("queue_seconds", "f4", "s", "time in the parameter rank's admission queue"),
        _c("compute_seconds", "f4", "s", "learner group wall time computing the gradient"),
        _c("mailbox_wait_seconds", "f4", "s", "time the learner waited for a free mailbox slot"),
        _c("inner_steps", "i4", "", "learners.push=update: optimizer steps the group took to make the update "
           "(the row is then an update, its loss their mean); 0 for a gradient"),
    )),
    TableSpec("episodes", "One row per finished episode on any actor.", (
        _c("time", "f8", "s", "time the episode ended, since run start", True),
        _c("actor", "i4", "", "actor index", True),
        _c("env_index", "i4", "", "environment instance within the actor", True),
        _c("return", "f4", "", "undiscounted episodic return", True),
        _c("length", "i4", "steps", "episode length", True),
        _c("policy_version", "i8", "", "policy version the actor held when the episode ended"),
        _c("env_steps", "i8", "steps", "environment steps of the whole run when the episode ended (as known to the writer)"),
    )),
    TableSpec("eval_episodes", "One row per evaluation episode (greedy policy, own env copies and seeds; eval.*).", (
        _c("time", "f8", "s", "time the evaluation ended, since run start", True),
        _c("round", "i8", "", "training rounds ended when the evaluation was requested", True),
        _c("policy_version", "i8", "", "policy version evaluated", True),
        _c("env_index", "i4", "", "evaluation env copy", True),
        _c("return", "f4", "", "undiscounted episodic return", True),
        _c("length", "i4", "steps", "episode length", True),
    )),
    TableSpec("learner_activity", "One row per stretch of gradient computation by a learner group (the cost model's input).", (
        _c("time_start", "f8", "s", "start of the stretch, since run start", True),
        _c("time_end", "f8", "s", "end of the stretch, since run start", True),
        _c("group", "i4", "", "learner group", True),
        _c("compute_seconds", "f4", "s", "seconds spent computing (excludes waiting)", True),
        _c("samples", "i4", "steps", "environment steps processed"),
    )),
    TableSpec("learner_cycles", "One row per gradient a learner group pushed: where the group root's wall time went. "
              "The cycle runs from the group's previous push (or the end of a park) to this push; its phases add up "
              "to cycle_seconds, and waiting or post-processing before a batch's first gradient is charged to it.", (
        _c("time", "f8", "s", "time the push completed, since run start", True),
        _c("group", "i4", "", "learner group", True),
        _c("seq", "i8", "", "the group's sequence number (joins the gradients table)", True),
        _c("base_version", "i8", "", "policy version the gradient was computed with"),
        _c("cycle_seconds", "f4", "s", "wall time of the whole cycle", True),
        _c("idle_seconds", "f4", "s", "waiting: for fragments to fill a batch, or for the admission policy (sync, ssp)"),
        _c("receive_seconds", "f4", "s", "taking fragments from the actors (poll and unpack)"),
        _c("prepare_seconds", "f4", "s", "post-processing the batch (algo.prepare, e.g. GAE); on the batch's first gradient"),
        _c("minibatch_seconds", "f4", "s", "cutting the minibatch out of the batch"),
        _c("control_seconds", "f4", "s", "job counter reads and updates, heartbeat"),
        _c("weights_seconds", "f4", "s", "fetching the newest weights from the weight board and loading them"),
        _c("window_seconds", "f4", "s", "log-probs under the other groups' versions (IS truncation window)"),
        _c("gradient_seconds", "f4", "s", "algo.compute_gradient: forward, backward, clipping"),
        _c("flatten_seconds", "f4", "s", "gradient and stats to host numpy and floats"),
        _c("allreduce_seconds", "f4", "s", "sending the group's other ranks their shares and averaging (0 for one rank)"),
        _c("push_seconds", "f4", "s", "putting the gradient into a mailbox slot"),
        _c("push_wait_seconds", "f4", "s", "waiting for a free mailbox slot"),
    )),
    TableSpec("parameter_load", "One row per half second of the parameter rank: gradients in, where its time went, "
              "and how fast it could absorb gradients.", (
        _c("time", "f8", "s", "end of the interval, since run start", True),
        _c("interval_seconds", "f4", "s", "length of the interval", True),
        _c("gradients", "i4", "", "gradients taken out of the mailbox", True),
        _c("applied", "i4", "", "gradients applied (admitted)"),
        _c("updates", "i4", "", "optimizer steps (aggregation events)"),
        _c("receive_seconds", "f4", "s", "copying gradients out of the mailbox (polls that find none count as idle)"),
        _c("admit_seconds", "f4", "s", "admission decisions and their bookkeeping"),
        _c("apply_seconds", "f4", "s", "combining gradients and stepping the optimizer"),
        _c("publish_seconds", "f4", "s", "publishing new weights on the weight board"),
        _c("record_seconds", "f4", "s", "record rows, reports from actors and learners, file flushes"),
        _c("idle_seconds", "f4", "s", "sleeping, and polling the mailbox without finding a gradient"),
        _c("other_seconds", "f4", "s", "watchdog, elasticity, stop rule, progress, checkpoints, round ends"),
        _c("cpu_seconds", "f4", "s", "the parameter rank's CPU seconds in the interval (its thread's; under "
           "launch.runner=sim its priced work): below the busy phases' sum when it waited inside them"),
        _c("absorption_rate", "f4", "1/s", "gradients per second of gradient work: gradients / (receive + admit "
           "+ apply + publish seconds), the rate the rank could take; NaN without gradients"),
        _c("arrival_rate", "f4", "1/s", "gradients / interval_seconds"),
    )),
    TableSpec("elastic_events", "One row per activation or park of a learner group (the parameter rank's decisions, "
              "runtime/roles/elastic.py: supply S of env steps/s from the actors vs capacity C of env steps per busy second "
              "of a group), and one per park a group left, with what the park cost it.", (
        _c("time", "f8", "s", "time of the decision, or the end of the park, since run start", True),
        _c("group", "i4", "", "the learner group activated, parked, or reporting its park", True),
        _c("action", "i1", "code", "what happened", True, ELASTIC_ACTIONS),
        _c("reason", "i1", "code", "why", True, ELASTIC_REASONS),
        _c("active_groups", "i4", "", "active groups after the decision"),
        _c("supply_rate", "f4", "steps/s", "S: env steps per second the actors sample while sampling, summed"),
        _c("group_rate", "f4", "steps/s", "C: env steps a learner group consumes per busy second (no waits)"),
        _c("load", "f4", "", "S / (active groups before the decision x C)"),
        _c("fragments_waiting", "i4", "", "fragments queued at the active groups when deciding"),
        _c("parked_seconds", "f4", "s", "parked rows: how long the group was parked; joined / left / "
           "join_given_up rows: the wait for the joining ranks / their time in the job / the wait given up"),
        _c("cpu_seconds", "f4", "s", "parked rows: CPU seconds the group root used while parked"),
    )),
    TableSpec("rounds", "One row per training round (train_batch_size new environment steps consumed).", (
        _c("round", "i8", "", "round id k (0 = the threshold-free observation round)", True),
        _c("start", "f8", "s", "round start, since run start", True),
        _c("duration", "f4", "s", "round wall time", True),
        _c("env_steps", "i8", "steps", "environment steps consumed in the round"),
        _c("env_steps_total", "i8", "steps", "environment steps consumed since the run started, at the round's end"),
        _c("episodes", "i4", "", "episodes finished during the round"),
        _c("updates", "i4", "", "aggregation events during the round"),
        _c("threshold", "f4", "versions", "beta_k of the round (Stellaris Eq. 3); NaN when none"),
        _c("staleness_mean", "f4", "versions", "mean staleness of gradients admitted in the round"),
        _c("staleness_max", "f4", "versions", "largest admitted staleness"),
        _c("staleness_min", "f4", "versions", "smallest admitted staleness"),
        _c("staleness_std", "f4", "versions", "standard deviation of admitted staleness"),
        _c("learner_seconds", "f4", "s", "learner compute seconds summed over groups (active time only)"),
        _c("actor_seconds", "f4", "s", "actor sampling seconds summed over actors"),
        _c("active_actors", "i4", "", "actors that delivered a fragment during the round"),
        _c("active_groups", "i4", "", "largest number of active learner groups during the round"),
        _c("loss", "f4", "", "mean training loss of the admitted gradients"),
        _c("reward_mean", "f4", "", "mean return of episodes finished in the round"),
        _c("reward_max", "f4", "", "largest return"),
        _c("reward_min", "f4", "", "smallest return"),
        _c("reward_std", "f4", "", "standard deviation of returns"),
    )),
    TableSpec("policy_map", "One row per agent whose policy changed in a dynamic learner sharing switch (MARLess section 4.3; algo.sharing).", (
        _c("round", "i8", "", "round whose end decided the switch; the new map is in the next published version", True),
        _c("agent", "i4", "", "agent (instance env_index mod algo.agents)", True),
        _c("old_policy", "i4", "", "policy slot the agent used before", True),
        _c("new_policy", "i4", "", "policy slot the agent uses from the next version", True),
        _c("reason", "S96", "", "why: the window slope k against gamma, sharing on (j-th time) or off, policies after", True),
        _c("policies", "i4", "", "distinct policies in use after the switch"),
        _c("copied_from", "i4", "", "slot whose weights were copied into new_policy (optimizer state reset); -1 none"),
    )),
    TableSpec("actor_scaling", "One row per round with MARL actor scaling on (MARLess section 4.4, Eq. 2; "
              "algo.actor_scaling): the actor demand from the policies' convexity windows and the actor ranks "
              "that sample the next round (ranks 0 .. active-1; the others park).", (
        _c("round", "i8", "", "round whose end decided; the count holds for the next round", True),
        _c("demanded", "i4", "actors", "I_t of Eq. 2 (-1: no learner report yet, no demand)"),
        _c("active", "i4", "actors", "active actor ranks for the next round", True),
        _c("changed", "i1", "", "1 when active differs from the round before"),
        _c("policies", "i4", "", "policies in use (after the round's sharing decision)"),
        _c("policy_demands", "S192", "", "per policy slot: I^j and its convexity ratio C, as slot:I^j(C=...)"),
        _c("reason", "S160", "", "the branch of Eq. 2 (I_average vs beta (I_max - I_min)) and [I_min, I_max]"),
    )),
    TableSpec("actor_parks", "One row per park an actor rank left (actor scaling): how long it was parked and "
              "the CPU it used meanwhile.", (
        _c("time", "f8", "s", "end of the park, since run start", True),
        _c("actor", "i4", "", "actor index", True),
        _c("reason", "i1", "code", "why the park ended", True, PARK_REASONS),
        _c("parked_seconds", "f4", "s", "how long the actor was parked"),
        _c("cpu_seconds", "f4", "s", "CPU seconds the actor's thread used while parked"),
        _c("active_actors", "i4", "", "active actor ranks when the park ended"),
    )),
    TableSpec("actor_joins", "One row per join, leave or given-up join of an actor's sampler (actors.elastic steps "
              "or jobs, runtime/roles/joining_sampler.py): the rank that steps the actor's environments while it is "
              "active.", (
        _c("time", "f8", "s", "when it happened, since run start", True),
        _c("actor", "i4", "", "actor index", True),
        _c("action", "i1", "code", "joined, left or join_given_up", True, ELASTIC_ACTIONS),
        _c("reason", "i1", "code", "job_step (joined or left cleanly), join_ended (its launch ended first), "
           "join_timeout", True, ELASTIC_REASONS),
        _c("seconds", "f4", "s", "joined: the wait for it; left: its time in the job; join_given_up: the wait "
           "given up"),
        _c("active_actors", "i4", "", "active actor ranks then"),
    )),
    TableSpec("weight_fetches", "One row per version the parameter rank published (MPI runner): the copies of "
              "it that readers took from rank 0's weight board, and their bytes, by reader kind. Actors that share "
              "a node's weight cache (runtime/transport/node_cache.py) fetch a version once per node; a version "
              "nobody read has zeros. A resumed job republishes the checkpoint's version: it can have a row "
              "from each job (add them).", (
        _c("version", "i8", "", "the published version", True),
        _c("actor_fetches", "i4", "", "copies of the version's data actor ranks took from rank 0 (one per node "
           "with the node cache; probe-only reads of actors.weight_sync=aaps count too)", True),
        _c("actor_bytes", "i8", "B", "bytes of those copies", True),
        _c("learner_fetches", "i4", "", "copies learner ranks took (the newest weights, older versions for "
           "the IS window)", True),
        _c("learner_bytes", "i8", "B", "bytes of those copies", True),
    )),
    TableSpec("allocations", "One row per start of the run inside a batch job (first start, each resume): the "
              "scheduler's job that ran it, which `hpcrl analyze` looks up in the accounting (sacct) to give the "
              "node-seconds the user is billed. Written from the parameter rank's environment; a run started "
              "outside a batch job has none.", (
        _c("time", "f8", "s", "when the ranks started, since run start", True),
        _c("scheduler", "i1", "code", "the batch scheduler", True, SCHEDULERS),
        _c("job_id", "S32", "", "the job (SLURM_JOB_ID, PBS_JOBID)", True),
        _c("step_id", "S16", "", "Slurm job step of the parameter rank (SLURM_STEP_ID; empty: not in a step)"),
        _c("cluster", "S32", "", "SLURM_CLUSTER_NAME (sacct --clusters); empty under PBS"),
        _c("nodes", "i4", "", "nodes of the job when the ranks started"),
        _c("site", "S32", "", "the hpcrl site that wrote the batch script (hpcrl submit --site; empty: another script)"),
        _c("charge_unit", "S32", "", "what the site bills (e.g. GPU node-hours), from its site file"),
        _c("charge_per_node_hour", "f8", "", "the site's charge factor: units billed per node-hour"),
    )),
    TableSpec("actors", "Optional: one row per trajectory fragment an actor produced (latency breakdown).", (
        _c("time", "f8", "s", "time the fragment was handed to transport, since run start", True),
        _c("actor", "i4", "", "actor index", True),
        _c("fragment", "i8", "", "the actor's fragment sequence number", True),
        _c("steps", "i4", "steps", "environment steps in the fragment (fragment_length x num_envs)"),
        _c("sample_seconds", "f4", "s", "wall time stepping the environments and the policy"),
        _c("transport_wait_seconds", "f4", "s", "time waiting for an in-flight slot to free (back-pressure)"),
        _c("weight_sync_seconds", "f4", "s", "time pulling new weights before the fragment (0 when skipped)"),
        _c("policy_version", "i8", "", "policy version that sampled the fragment"),
        _c("group", "i4", "", "learner group the fragment was sent to (-1: every active group, MARL policy learners)"),
    )),
)
TABLES: dict[str, TableSpec] = {t.name: t for t in TABLE_LIST}


@dataclass(frozen=True)
class TrajField:
    name: str
    dtype: str
    unit: str
    meaning: str
    per_step_shape: str = ""
    """'obs' / 'action' for fields whose trailing shape comes from the layout."""


TRAJ_FIELDS = (
    TrajField("obs", "", "", "observation the action was taken in", "obs"),
    TrajField("actions", "", "", "action taken", "action"),
    TrajField("rewards", "f4", "", "reward received after the action"),
    TrajField("terminated", "i1", "", "1 if the episode ended in a terminal state after this step"),
    TrajField("truncated", "i1", "", "1 if the episode was cut by a time limit after this step (bootstrap from values)"),
    TrajField("behaviour_logp", "f4", "nats", "log-probability of the action under the behaviour policy mu"),
    TrajField("values", "f4", "", "value estimate of obs by the behaviour policy's critic"),
    TrajField("bootstrap_values", "f4", "", "behaviour critic's value of the observation after this step where the "
              "next row does not continue from it: the final observation on a truncated step, the next fragment's "
              "first observation on a fragment's last step; 0 elsewhere and after a terminal step; NaN: not recorded"),
    TrajField("policy_version", "i8", "", "policy version that chose the action"),
    TrajField("env_index", "i4", "", "environment instance within the actor"),
)
TRAJ_FIELD_NAMES = tuple(f.name for f in TRAJ_FIELDS)


@dataclass(frozen=True)
class TrajLayout:
    """Per-step shapes and dtypes of a trajectory file's ``obs`` and ``actions`` datasets."""

    obs_shape: tuple[int, ...]
    action_shape: tuple[int, ...] = ()
    obs_dtype: str = "f4"
    action_dtype: str = "f4"
    """'f4' for continuous actions, 'i8' for discrete ones."""
    num_envs: int = 1
    """Environments per actor (N of a [T, N, ...] fragment)."""

    def field_dtype(self, f: TrajField) -> np.dtype:
        if f.per_step_shape == "obs":
            return np.dtype(self.obs_dtype)
        if f.per_step_shape == "action":
            return np.dtype(self.action_dtype)
        return np.dtype(f.dtype)

    def field_shape(self, f: TrajField) -> tuple[int, ...]:
        return tuple(self.obs_shape) if f.per_step_shape == "obs" else (
            tuple(self.action_shape) if f.per_step_shape == "action" else ())

    def to_attrs(self) -> dict:
        return {"obs_shape": np.asarray(self.obs_shape, "i8"), "action_shape": np.asarray(self.action_shape, "i8"),
                "obs_dtype": self.obs_dtype, "action_dtype": self.action_dtype, "num_envs": self.num_envs}

    @classmethod
    def from_attrs(cls, attrs) -> "TrajLayout":
        def text(v):
            return v.decode() if isinstance(v, bytes) else str(v)
        return cls(tuple(int(x) for x in attrs["obs_shape"]), tuple(int(x) for x in attrs["action_shape"]),
                   text(attrs["obs_dtype"]), text(attrs["action_dtype"]), int(attrs["num_envs"]))


def fill_value(dtype) -> object:
    """Fill used for padding (virtual datasets) and missing optional columns."""
    kind = np.dtype(dtype).kind
    return np.nan if kind == "f" else (b"" if kind == "S" else -1)


def render_markdown() -> str:
    """docs/hdf5-schema.md, rendered from the tables above."""
    out = [
        "# HDF5 record schema",
        "",
        f"Rendered from `hpcrl/io/schema.py` (schema version {SCHEMA_VERSION}) by "
        "`python -m hpcrl.io.schema > docs/hdf5-schema.md`; `tests/test_io.py` fails when they differ.",
        "",
        "A run directory holds `config.yaml`, `run.h5` (written by the parameter rank), "
        "`traj/actor-NNNNN.h5` (one per actor, NNNNN = actor index), with `actors.reports: summary` "
        "`nodes/node-RRRRR.h5` (one per node, see below), `checkpoints/latest.pt` and "
        "`checkpoints/previous.pt`, and `run.lock` (host and pid of the job using the directory) while a job "
        "runs. Times are seconds since the run "
        "started (`start_unix` attribute of run.h5). Optional columns that a writer did not fill hold "
        "NaN (floats) or -1 (integers).",
        "",
        "## File format and readers",
        "",
        "Every file is written in HDF5 1.10's format (h5py `libver=(\"v110\", \"v110\")`, "
        "`hpcrl/io/h5format.py`): SWMR and the virtual `trajectories/` view need no newer format, and HDF5 "
        "1.10, 1.12, 1.14 and 2.0 tools open it (h5dump/h5ls, h5py, PyTables, HDFView; tested: Debian's "
        "hdf5-tools 1.10.8, h5py 3.7 on HDF5 1.10.8, h5py 3.16 on HDF5 2.0). Runs written by hpcrl before "
        "this (`libver=\"latest\"`: HDF5 2.0's format under the h5py 3.16 wheel) still resume and analyse; "
        "`hpcrl convert RUN_DIR` rewrites them in 1.10's format for older readers.",
        "",
        "## run.h5 attributes",
        "",
        "| attribute | meaning |",
        "| --- | --- |",
        "| `schema_version` | this schema's version (int) |",
        "| `hpcrl_version` | hpcrl version that created the file |",
        "| `created` | creation time, ISO 8601 UTC |",
        "| `start_unix` | run start, seconds since the Unix epoch; every `time` column counts from here |",
        "| `config_yaml` | the resolved config text |",
        "| `resumed_unix` | times (Unix s) the file was reopened to resume, one per resume |",
        "| `compression` | the HDF5 filter of the tables and trajectories (`io.compression`) |",
        "| `resumed` | one JSON note per resume: the rows discarded back to the checkpoint and the version it restored |",
        "| `runner` | `mpi` or `serial`: which runner wrote the file (the only thing that tells them apart) |",
        "| `num_params` | parameters in the model's flat buffer (everything published to actors) |",
        "| `command_unix` | when the `hpcrl run` command started (Unix s; written by the launcher after the run) |",
        "| `startup_seconds` | from the command to the first environment step of any actor (`hpcrl run` only) |",
        "",
        "Every table is a group of equal-length, resizable, chunked, compressed 1-D datasets, one per "
        "column; each dataset has `units` and `description` attributes, code columns also `codes`. "
        "The group's `columns` attribute lists the column order and its `committed_rows` attribute how many "
        "rows are fully written: use no more (see the last section). The same count is the one-element "
        "dataset `committed/<table>` at the root, for readers that keep the file open.",
        "",
    ]
    for t in TABLE_LIST:
        out += [f"## table `{t.name}`", "", t.meaning, "",
                "| column | dtype | unit | required | meaning |", "| --- | --- | --- | --- | --- |"]
        for c in t.columns:
            meaning = c.meaning + (f" (codes: {', '.join(f'{i} {n}' for i, n in enumerate(c.codes))})" if c.codes else "")
            out.append(f"| `{c.name}` | {c.dtype} | {c.unit or '-'} | {'yes' if c.required else ''} | {meaning} |")
        out.append("")
    out += [
        "## traj/actor-NNNNN.h5",
        "",
        "One file per actor. Each dataset is `[steps, *per_step_shape]`, resizable along axis 0. A fragment "
        "`[T, N, ...]` (T time steps of N environments) is flattened time-major: step `t * N + n` holds "
        "time `t` of environment `n`. Root attributes: `schema_version`, `actor`, `obs_shape`, `action_shape`, "
        "`obs_dtype`, `action_dtype`, `num_envs`, `committed_steps` (steps fully written: use no more; also the one-element dataset "
        "`committed/steps`). "
        "`policy_version` is written last, so `policy_version >= 0` marks a step whose datasets all hold data.",
        "",
        "| dataset | dtype | per-step shape | unit | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in TRAJ_FIELDS:
        shape = {"obs": "obs_shape", "action": "action_shape"}.get(f.per_step_shape, "()")
        dtype = {"obs": "obs_dtype", "action": "action_dtype"}.get(f.per_step_shape, f.dtype)
        out.append(f"| `{f.name}` | {dtype} | {shape} | {f.unit or '-'} | {f.meaning} |")
    out += [
        "",
        "## run.h5 `trajectories/<dataset>` (virtual)",
        "",
        "For every dataset above, a virtual dataset of shape `[num_actors, steps, *per_step_shape]` maps "
        "actor `a`'s file onto row `a`, with an unlimited step axis that grows as the actors' files grow "
        "(no rewrite of run.h5 needed). Actors with fewer steps, or whose file does not exist yet, are "
        "padded with NaN (floats) or -1 (integers): `trajectories/policy_version >= 0` marks real steps. "
        "Source paths are relative to run.h5, so the run directory can be moved or copied whole. HDF5 opens "
        "the actors' files in the mode run.h5 was opened in: open run.h5 with `swmr=True` (or use "
        "`hpcrl.io.read_trajectories`), or reading the view fails (\"file is already open for write\") once "
        "any actor was killed.",
        "",
        "## nodes/node-RRRRR.h5",
        "",
        "Only with `actors.reports: summary`: each node's report relay (world rank RRRRR) writes the `actors` and "
        "`episodes` rows of its node's fragments here instead of rank 0 writing them to run.h5 (which then holds "
        "few or none). The tables are run.h5's (same columns, `committed_rows`, `committed/<table>`, SWMR); root "
        "attributes `schema_version`, `relay` and `start_unix`. Its `time` columns count from its own "
        "`start_unix`: time `t` there is `t + start_unix(node file) - start_unix(run.h5)` on run.h5's clock. "
        "`hpcrl.io.read_table(run_dir, 'actors' or 'episodes')` and `hpcrl analyze` join every node file's rows "
        "to run.h5's, shifted so, sorted by time; `hpcrl.io.follow(run_dir, 'actors' or 'episodes')` does so for "
        "each batch of new rows, following each node file by its `committed/<table>` from when it appears; the "
        "checkpoint counts each node file's rows and "
        "`hpcrl run --resume` cuts each back to them (a node file started after the checkpoint to none).",
        "",
        "## Writing and reading while a run is going",
        "",
        "The writers (one per file: the parameter rank for run.h5, each actor for its traj file) create every "
        "dataset first and then switch to HDF5 SWMR mode; rows are buffered in memory and written every "
        "`io.flush_seconds` and at close: every column is resized and written, flushed to the file, and only "
        "then is the committed count raised (the `committed/<table>` dataset, then the `committed_rows` "
        "attribute; `committed/steps` and `committed_steps` in a trajectory file). A killed job leaves each file as of its last flush. "
        "A write that fails (disk full, quota, I/O error) stops the job with one line (`RecordWriteError`: "
        "\"disk full at PATH ...\"); the files keep everything flushed before.",
        "",
        "To read a file whose writer is running or was killed, either call `hpcrl.io.read_table(run_dir, name)`, "
        "`read_trajectory(path)` or `read_trajectories(run_dir)` (they do all of the following), or, with h5py:",
        "",
        "1. open with `h5py.File(path, 'r', swmr=True, locking=False)`: a plain open answers \"file is already open "
        "for write\" while a writer has the file open or after it was killed, and run.h5's `trajectories/` "
        "view fails through a plain open once an actor was killed;",
        "2. read `n = min(group.attrs['committed_rows'], shortest column)` rows of a table (`committed_steps` "
        "and the shortest dataset for a trajectory file): a reader can catch the writer between resizing one "
        "column and the next, and a flush cut short leaves columns longer than `committed_rows`, holding fill "
        "values. Files written before these attributes existed: the shortest column, without trailing rows "
        "whose required columns hold fill values. This rule holds for a file opened afresh for each read: "
        "h5py never re-reads an attribute of an open file.",
        "",
        "A reader that keeps the file open (an SWMR reader polling a running job) calls `refresh()` on the "
        "one-element dataset `committed/<table>` (`committed/steps` in a trajectory file), reads its value `n`, "
        "then calls `refresh()` on the columns and reads their rows below `n`: the writer raises that count only "
        "after every column's rows reached the file, so no row a resume later cuts back as unfinished is ever "
        "read. `hpcrl.io.follow(run_dir, table)` and `follow_trajectory(path)` do this and yield each batch "
        "of new rows; they end when the writer closes the file (or after `idle_seconds` without a new row). "
        "Rows past the last checkpoint were committed and are read; `hpcrl run --resume` rolls them back "
        "and notes it in the `resumed` attribute.",
        "",
        "SWMR needs POSIX write ordering: local disk, Lustre and GPFS are fine, NFS is not. On Lustre and NFS, "
        "HDF5 file locking fails (\"unable to lock file\"): hpcrl opens every file with `locking=False`; set "
        "`HDF5_USE_FILE_LOCKING=FALSE` for other tools. Resuming reopens the same files (`RunFile.open_append`, "
        "`TrajectoryWriter.open_append`), clearing the write flags a killed writer left in the superblock and "
        "cutting rows past the committed counts; `hpcrl.io.truncate_record` cuts the record back to the row "
        "counts a checkpoint stored.",
        "",
        "## A damaged file",
        "",
        "The metadata of these files (superblock, object headers, B-trees, heaps, chunk indexes) carries "
        "checksums. A plain reader that meets one that does not match fails at once; an SWMR reader takes it "
        "for a block the writer is still writing and reads it again, sleeping 1, 2, 4 ... ns between up to 100 "
        "attempts (past 600 s by the 40th), so a damaged block (bad disk, torn write, a stray byte) hangs it "
        "inside HDF5, where no Python timeout reaches. hpcrl's readers "
        "(`hpcrl.io.read_table`, `read_attrs`, `read_trajectory`, `read_trajectories`, `open_run_file`, "
        "`follow`, and `hpcrl analyze`) therefore open a file plainly when its superblock's write flags are "
        "clear (no writer holds it), and before reading a held file (a running job, or one killed with the file "
        "open) as an SWMR reader they read its metadata in a child process that is killed after "
        "`HPCRL_READ_TIMEOUT` seconds (default 30; once per state of the file, about 0.3 s). Damage is one "
        "line, `RecordDamagedError` (a `RunFileError`; `hpcrl analyze` exits 2), naming the file and the "
        "table, e.g. `.../run.h5: table 'episodes' is damaged (Unable to synchronously open object (incorrect "
        "metadata checksum after all read attempts))`; the other tables still read. Reading never writes to "
        "a file. Your own h5py scripts: open a file no writer holds without `swmr=True`.",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
