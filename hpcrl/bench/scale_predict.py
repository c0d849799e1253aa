"""The scale model of an hpcrl job: measured per-operation costs + a layout -> env steps/s and rank 0's load.

A pure function (:func:`predict`) and the layouts it is asked about; ``hpcrl bench scale-model`` measures the
costs and prints the tables (docs/scaling.md says what the model assumes).

Every role is a loop of operations whose costs are measured; each gives a bound on env steps/s:

- actors (``A`` ranks, a core each): per env step ``actor_step``, per fragment of ``F`` steps one fragment send,
  and a weight fetch whenever a newer version exists (per-actor fetch: from rank 0; per-node fetch: the node's
  copy, and the node's leader fetches from rank 0 once per version; ``tree=k``, launch.weight_tree: only k nodes
  fetch a version from rank 0, the others from relays on other nodes, each relay filled once per version);
- learner groups (``G``, one rank each): per minibatch one gradient; ``push: gradient`` pushes each and reads the
  newest weights before the next, ``push: update`` steps its own optimizer and pushes once per batch of ``B``
  env steps (``M`` minibatches);
- rank 0: per push a receive and an admission; per step (one per push) an apply and a publish; per fragment an
  actor's report and its rows in the record (``reports="node"``: per node message of its k actors' reports
  ``report + (k - 1) report_each``, the rows still per report; ``reports="summary"``: per node message, one every
  flush interval, ``summary``, the rows written by the node's relay, which the node's actors pay);
- rank 0's network interface: every fetch sends the weights (4 P bytes) out, every push brings 4 P bytes in;
- where ranks share cores (the local cluster): all their seconds per env step over the cores there are.

The job runs at the smallest bound; the role that sets it is the bottleneck.

``topology="allreduce"`` is the other way to train at scale (DD-PPO, Wijmans et al. 2020), as built
(``learners.topology: allreduce``): no admission; the G learner ranks average each minibatch's gradient by an
allreduce over the learners' nodes and each steps its own copy of the weights; after a batch of all G, one
learner pushes the weights to rank 0, which publishes them (one version per G batches) and keeps the record.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hpcrl.runtime.transport.report_packing import summary_interval

PUSH_MODES = ("gradient", "update")
FETCH_MODES = ("actor", "node")
TOPOLOGIES = ("server", "allreduce")
ADMISSIONS = ("async", "sync")
REPORT_MODES = ("fragment", "node", "summary")


@dataclass(frozen=True)
class Linear:
    """A cost in seconds that grows with the weights: ``fixed + per_float * P``."""

    fixed: float
    per_float: float = 0.0

    def __call__(self, floats: int) -> float:
        return self.fixed + self.per_float * floats

    @classmethod
    def fit(cls, sizes: list[int], seconds: list[float]) -> "Linear":
        """Least squares through (size, seconds), both terms kept >= 0 (one size: all of it fixed)."""
        if len(set(sizes)) < 2:
            return cls(max(sum(seconds) / len(seconds), 0.0))
        n = len(sizes)
        mx, my = sum(sizes) / n, sum(seconds) / n
        slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / sum((x - mx) ** 2 for x in sizes)
        slope = max(slope, 0.0)
        return cls(max(my - slope * mx, 0.0), slope)


@dataclass(frozen=True)
class Costs:
    """Seconds per operation (``Linear`` ones at P weight floats)."""

    push: Linear            # learner: one mailbox push (gradient or update), claim to FULL
    receive: Linear         # rank 0: one push copied out of the mailbox
    admit: float            # rank 0: the admission policy on one arrival
    apply_gradient: Linear  # rank 0: the optimizer (Adam) step; also a learner's inner step under push: update
    apply_update: Linear    # rank 0: the outer step on an admitted update
    publish: Linear         # rank 0: one weight board publish
    fetch: Linear           # any rank: one read of a new version from rank 0's weight board
    node_copy: Linear       # an actor: its node's cached copy of the weights (a memcpy)
    fragment_send: float    # actor -> learner: one fragment, sent and taken
    report: float           # rank 0: one actor fragment report taken in
    actor_step: float       # actor: one env step (env + policy), per env step of its vector
    gradient: float         # learner: one minibatch gradient
    report_each: float = 0.0  # rank 0: each further report in a node's message (actors.reports: node); 0: none
    record: float = 0.0       # rank 0: the record's work per fragment report (its rows, the round's statistics)
    record_node: float | None = None  # ... per report that came in a node's message, as columns (None: as record)
    summary: float | None = None  # rank 0: one node's summary of its 64 actors taken in and handled (actors.reports:
    #                               summary; None: not measured)
    node_pack: float = 0.0  # a node's relay: one summary made, its 64 reports' rows written to the node file, flushed


@dataclass(frozen=True)
class Workload:
    """What the job trains: weights, and its steps per batch, minibatch and fragment."""

    floats: int          # P: weight (= gradient = update) float32 values
    batch_steps: int     # B: env steps one learner group trains per batch
    minibatches: int     # M: minibatch steps per batch (PPO: num_sgd_iter x B / minibatch_size)
    fragment_steps: int  # F: env steps per fragment (fragment_length x num_envs)
    untrained: int = 1   # U: floats no optimizer steps (PPO's KL coefficient): all an allreduce group reads back


@dataclass(frozen=True)
class Layout:
    """Where the ranks are: actors, the nodes holding them, learner groups, shared cores, rank 0's link."""

    nodes: int
    actors: int
    actor_nodes: int
    learners: int
    cores: float | None = None            # None: every rank has a core of its own
    nic_bytes_per_s: float | None = None  # rank 0's injection bandwidth; None: no limit


    @property
    def actors_per_node(self) -> float:
        return self.actors / max(self.actor_nodes, 1)


@dataclass(frozen=True)
class Interconnect:
    """The links between the learners' nodes, for ``topology="allreduce"``. Defaults: Slingshot-11, a GPU node of
    Perlmutter with 4 learner ranks and 4 NICs of 25 GB/s (docs.nersc.gov, Perlmutter architecture)."""

    latency: float = 3e-6              # seconds per message between nodes
    node_bytes_per_s: float = 100e9    # one learner node's injection bandwidth
    learners_per_node: int = 4

    def allreduce(self, floats: int, learners: int) -> float:
        """Seconds of one allreduce of ``floats`` float32 values over ``learners`` ranks: summed on each node first
        (over NVLink: left out), then across the n nodes by reduce-scatter and allgather (Rabenseifner's algorithm,
        Thakur, Rabenseifner & Gropp 2005): 2 ceil(log2 n) latencies and 2 (n - 1) / n of the bytes through each
        node's link."""
        nodes = -(-learners // self.learners_per_node)
        if nodes <= 1:
            return 0.0
        return 2 * math.ceil(math.log2(nodes)) * self.latency + 2 * (nodes - 1) / nodes * 4 * floats / self.node_bytes_per_s


@dataclass(frozen=True)
class Prediction:
    env_steps_per_s: float
    pushes_per_s: float
    rank0_busy: float              # share of rank 0's time at work (1: saturated)
    rank0_out_bytes_per_s: float   # weights sent by rank 0 (fetches)
    rank0_in_bytes_per_s: float    # pushes received
    bottleneck: str
    bounds: dict                   # env steps/s each part allows


def report_seconds(costs: Costs, work: Workload, layout: Layout, reports: str) -> float:
    """Rank 0's seconds per env step taking in the actors' reports: one message per fragment, or
    (``reports="node"``, ``actors.reports: node``) one per node holding a report of each of its k actors, which
    costs a message and k - 1 further reports (their unpickling: ``report_each``); in both, each report's rows in
    the record (``record``; ``record_node`` when they come as a node's columns). ``reports="summary"``: one
    message per node and flush interval, ``summary`` each (its rows are the node's work: :func:`_actors`)."""
    if reports not in REPORT_MODES:
        raise ValueError(f"reports must be one of {REPORT_MODES}")
    F = work.fragment_steps
    if reports == "fragment":
        return (costs.report + costs.record) / F
    k = max(layout.actors_per_node, 1.0)
    if reports == "summary":
        if costs.summary is None:
            raise ValueError("reports=summary: these costs have no 'summary' (measured before it was built); "
                             "measure them again with hpcrl bench scale-model --json FILE")
        return costs.summary / summary_steps(costs, work, layout)
    record = costs.record if costs.record_node is None else costs.record_node
    return (costs.report + (k - 1) * costs.report_each) / (F * k) + record / F


def summary_steps(costs: Costs, work: Workload, layout: Layout) -> float:
    """Env steps in one node's summary: its k actors' steps in a summary interval (50 ms, longer past 100 actor nodes
    so that rank 0 gets at most 2,000 summaries a second: ``summary_interval``) at their own pace (one env step per
    ``actor_step``), and at least a fragment (a relay sends nothing before a fragment comes)."""
    return max(float(work.fragment_steps),
               layout.actors_per_node * summary_interval(layout.actor_nodes) / max(costs.actor_step, 1e-12))


def per_env_step(costs: Costs, work: Workload, layout: Layout, push: str, fetch: str, combine: int = 1,
                 shards: int = 1, reports: str = "fragment", admission: str = "async", tree: int = 0) -> dict:
    """Seconds (summed over each role's ranks) and rank-0 bytes per env step, and the rates behind them.

    ``admission``: ``async`` makes a version of every push (Stellaris' pure async, its bound); ``sync`` one of a
    push of every learner (L of them). ``combine`` (learners.combine=node, built for sync admission): the pushes
    of ``combine`` learners of a node are summed on the node, so rank 0 receives one in ``combine``; it still
    admits each learner's (a record per member). ``shards`` (aggregation.shards): ``shards`` parameter ranks own
    P / shards floats each; every push and fetch is one per shard of that size, the reports still go to one of
    them (the busiest, which the result describes)."""
    if push not in PUSH_MODES or fetch not in FETCH_MODES:
        raise ValueError(f"push must be one of {PUSH_MODES}, fetch one of {FETCH_MODES}")
    if combine < 1 or shards < 1:
        raise ValueError("combine and shards must be >= 1")
    if admission not in ADMISSIONS or (combine > 1 and admission != "sync"):
        raise ValueError(f"admission must be one of {ADMISSIONS}, and sync with combine > 1 (as built)")
    P, B, M = work.floats, work.batch_steps, work.minibatches
    if shards > 1:
        P = -(-P // shards)
        costs = replace(costs, push=_times(costs.push, shards), fetch=_times(costs.fetch, shards))
    learner_pushes = (M if push == "gradient" else 1) / B  # per env step, of all groups together
    pushes = learner_pushes / combine  # what reaches rank 0
    versions = learner_pushes / layout.learners if admission == "sync" else pushes
    actor, remote_fetches = _actors(costs, work, layout, fetch, versions, P, reports, tree)
    learner_fetches = min(learner_pushes, layout.learners * versions)
    if push == "gradient":
        learner = learner_pushes * (costs.gradient + costs.push(P)) + learner_fetches * costs.fetch(P)
    else:
        learner = (M / B) * (costs.gradient + costs.apply_gradient(P)) + learner_pushes * costs.push(P) \
            + learner_fetches * costs.fetch(P)
    apply = costs.apply_gradient if push == "gradient" else costs.apply_update
    rank0 = pushes * costs.receive(P) + learner_pushes * costs.admit + versions * (apply(P) + costs.publish(P)) \
        + report_seconds(costs, work, layout, reports)
    return {"actor": actor, "learner": learner, "rank0": rank0, "pushes": pushes,
            "out_bytes": 4 * P * (remote_fetches + learner_fetches), "in_bytes": 4 * P * pushes}


def _actors(costs: Costs, work: Workload, layout: Layout, fetch: str, versions: float, floats: int,
            reports: str = "fragment", tree: int = 0) -> tuple[float, float]:
    """The actors' seconds per env step (summed over them) and their weight fetches from rank 0 per env step.

    A reader fetches when a version newer than its own exists: at most once per version, and (actors) once per
    fragment of its own; A actors' fragments come every A*F env steps, so A*versions or 1/F per env step. With a
    weight tree of fanout ``tree`` (per-node fetch) only ``tree`` nodes' fetches reach rank 0; every node still
    fetches (from a relay), and each relay's fill costs its filler a second copy (out to the relay). Under
    ``reports="summary"`` each node's relay writes its node's rows and flushes its file once per summary
    (``node_pack``, mostly per column, not per row)."""
    F = work.fragment_steps
    readers = layout.actors if fetch == "actor" else layout.actor_nodes
    fetches = min(readers * versions, 1.0 / F)
    if tree and fetch == "node":
        from_rank0 = min(min(tree, readers) * versions, 1.0 / F)
        relays = max(readers - tree, 0) / tree  # nodes with children, about
        fetches += min(relays * versions, 1.0 / F)
    else:
        from_rank0 = fetches
    actor = costs.actor_step + costs.fragment_send / F + fetches * costs.fetch(floats)
    if reports == "summary":
        actor += costs.node_pack / summary_steps(costs, work, layout)
    if fetch == "node":
        actor += min(layout.actors * versions, 1.0 / F) * costs.node_copy(floats)
    return actor, from_rank0


def per_env_step_allreduce(costs: Costs, work: Workload, layout: Layout, net: Interconnect, fetch: str,
                           reports: str = "fragment", tree: int = 0) -> dict:
    """As :func:`per_env_step`, for ``topology="allreduce"``: per minibatch each learner computes its gradient,
    takes part in the allreduce and steps its own weights (Adam at the measured CPU cost: a GPU's is less); after a
    batch of all G learners (``G B`` env steps) one of them pushes the weights and rank 0 takes them (its outer
    step's cost, ``apply_update``) and publishes a version, which the actors (or their nodes' caches, or the
    tree's first nodes) fetch over rank 0's link; each learner reads back only its untrained values (``U`` floats:
    it holds the trained ones). Rank 0 also takes the fragment reports."""
    P, B, M, U = work.floats, work.batch_steps, work.minibatches, work.untrained
    G = layout.learners
    versions = 1.0 / (G * B)
    actor, remote_fetches = _actors(costs, work, layout, fetch, versions, P, reports, tree)
    learner_fetches = G * versions  # each learner starts its next batch with the new version's untrained values
    learner = (M / B) * (costs.gradient + net.allreduce(P, G) + costs.apply_gradient(P)) \
        + versions * costs.push(P) + learner_fetches * costs.fetch(U)
    rank0 = versions * (costs.receive(P) + costs.admit + costs.apply_update(P) + costs.publish(P)) \
        + report_seconds(costs, work, layout, reports)
    return {"actor": actor, "learner": learner, "rank0": rank0, "pushes": versions,
            "out_bytes": 4 * P * remote_fetches + 4 * U * learner_fetches, "in_bytes": 4 * P * versions}


def _times(cost: Linear, n: int) -> Linear:
    """``n`` operations of P / n floats each cost ``n`` fixed parts (the per-float part is unchanged in total,
    and the caller evaluates it at P / n, so it is scaled back up here)."""
    return Linear(n * cost.fixed, n * cost.per_float)


def predict(costs: Costs, work: Workload, layout: Layout, push: str = "gradient", fetch: str = "actor",
            combine: int = 1, shards: int = 1, reports: str = "fragment", topology: str = "server",
            net: Interconnect | None = None, admission: str = "async", tree: int = 0) -> Prediction:
    """Env steps/s of the job: the smallest of the bounds its roles, rank 0's link and the cores set. Under
    ``topology="allreduce"`` ``push``, ``combine`` and ``shards`` do not apply; ``tree`` (a weight tree's fanout,
    launch.weight_tree) needs ``fetch="node"``."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {TOPOLOGIES}")
    if tree and (tree < 2 or fetch != "node"):
        raise ValueError("tree: a fanout of 2 or more, over per-node fetch (fetch='node')")
    if topology == "allreduce":
        s = per_env_step_allreduce(costs, work, layout, net or Interconnect(), fetch, reports, tree)
    else:
        s = per_env_step(costs, work, layout, push, fetch, combine, shards, reports, admission, tree)

    def bound(capacity: float, need: float) -> float:
        return capacity / need if need > 0 else math.inf

    bounds = {"actors": bound(layout.actors, s["actor"]), "learners": bound(layout.learners, s["learner"]),
              "rank 0 CPU": bound(1.0, s["rank0"])}
    if layout.nic_bytes_per_s:
        bounds["rank 0 link"] = bound(layout.nic_bytes_per_s, max(s["out_bytes"], s["in_bytes"]))
    if layout.cores:
        bounds["cores"] = bound(layout.cores, s["actor"] + s["learner"] + s["rank0"])
    bottleneck = min(bounds, key=bounds.get)
    x = bounds[bottleneck]
    return Prediction(env_steps_per_s=x, pushes_per_s=x * s["pushes"], rank0_busy=x * s["rank0"],
                      rank0_out_bytes_per_s=x * s["out_bytes"], rank0_in_bytes_per_s=x * s["in_bytes"],
                      bottleneck=bottleneck, bounds=bounds)


def perlmutter(nodes: int, gpu_share: float = 0.5, actors_per_node: int = 64, learners_per_node: int = 4,
               nic_bytes_per_s: float = 25e9) -> Layout:
    """``nodes`` of a Perlmutter-like allocation: a ``gpu_share`` of them GPU nodes with ``learners_per_node``
    learner ranks (rank 0 on the first, on a core of its own), the rest CPU nodes of ``actors_per_node`` actors;
    one node alone is a GPU node whose free cores run actors. Rank 0 sends through one Slingshot-11 NIC."""
    gpu = max(1, min(nodes, round(nodes * gpu_share)))
    cpu = nodes - gpu
    actors = cpu * actors_per_node if cpu else actors_per_node - learners_per_node - 1
    return Layout(nodes=nodes, actors=actors, actor_nodes=max(cpu, 1), learners=gpu * learners_per_node,
                  nic_bytes_per_s=nic_bytes_per_s)


def scaling_efficiency(costs: Costs, work: Workload, nodes: int, layout_of=perlmutter, base_nodes: int = 2,
                       **variant) -> tuple[float, float]:
    """(env steps/s at ``nodes``, scaling efficiency): that rate over ``nodes`` x the per-node rate of the smallest
    allocation that has both kinds of node (``base_nodes``: one GPU node and one CPU node), under the same
    ``variant`` (what :func:`predict` takes beside the layout)."""
    rate = predict(costs, work, layout_of(nodes), **variant).env_steps_per_s
    per_node = predict(costs, work, layout_of(base_nodes), **variant).env_steps_per_s / base_nodes
    return rate, rate / (nodes * per_node)


def blend(local: Costs, remote: Costs, share: float) -> Costs:
    """Costs of a job whose actors sit on other nodes than rank 0 and the learners for ``share`` of them: the
    actors' fetch, fragment send and report taken at ``remote`` for that share, at ``local`` for the rest."""
    def mix(a, b):
        if isinstance(a, Linear):
            return Linear(a.fixed + share * (b.fixed - a.fixed), a.per_float + share * (b.per_float - a.per_float))
        return a + share * (b - a)

    return replace(local, fetch=mix(local.fetch, remote.fetch), fragment_send=mix(local.fragment_send, remote.fragment_send),
                   report=mix(local.report, remote.report))


def saturation_nodes(costs: Costs, work: Workload, push: str, fetch: str, layout_of=perlmutter,
                     limit: int = 1_000_000, **variant) -> int | None:
    """The fewest nodes at which rank 0 (CPU or link) is the bottleneck, or None below ``limit`` (``variant``:
    ``combine``, ``shards`` as :func:`predict` takes them)."""
    def saturated(n: int) -> bool:
        return predict(costs, work, layout_of(n), push, fetch, **variant).bottleneck.startswith("rank 0")

    lo, hi = 1, 1
    while not saturated(hi):
        if hi >= limit:
            return None
        lo, hi = hi, min(hi * 2, limit)
    if saturated(lo):
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if saturated(mid):
            hi = mid
        else:
            lo = mid
    return hi


def fmt_rate(x: float) -> str:
    """1,234 / 12.3K / 400K / 4.56M for a table."""
    if not math.isfinite(x):
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= 10 * scale or (unit != "K" and abs(x) >= scale):
            v = x / scale
            return f"{v:.2f}{unit}" if abs(v) < 10 else f"{v:.1f}{unit}" if abs(v) < 100 else f"{v:.0f}{unit}"
    return f"{x:,.0f}"
