"""The per-operation costs the scale model needs, measured with the runtime's own objects (no main: see scale_model).

:func:`transport` is one ``mpiexec -n 3`` micro-run: rank 0 owns a :class:`GradientMailbox` and a
:class:`WeightBoard` and does what the parameter rank does with each arrival (poll, the job's admission policy,
Adam or the outer step, publish); rank 1 pushes gradients as a learner does; rank 2, an actor, reads every new
version from the board while the pushes go on, then sends the job's fragments to rank 1 (``FragmentSender`` /
``FragmentReceiver``) and a fragment report per fragment to rank 0 (``MpiReports``, a report of the shape the
actor sends), then node messages of NODE_REPORTS reports each (``actors.reports: node``). All of it at each
weight size of ``sizes``; medians per operation. :func:`workload` times the actor's env step (its
``VectorSampler`` with the policy) and the learner's minibatch gradient in this process.
Costs are CPU seconds of the paying rank's thread (``clock``), so a loaded machine does not inflate them.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hpcrl.bench.scale_predict import Costs, Linear, Workload

WORKER_FLAG = "--scale-measure-worker"
NODE_REPORTS = 64
"""Reports in the node message the micro-run measures (``report_each``: each one past the first) and in each block of
``record_node``: what one node message holds in the model's layout, whose CPU nodes hold 64 actors (a relay sends
once every open actor of its node has a report in the message). Before 2026-11-30 it was 8."""
TCP_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "MPIR_CVAR_NOLOCAL": "1", "FI_TCP_IFACE": "lo"}
"""A micro-run's ranks as if on different nodes: MPICH's OFI netmod over TCP, no shared memory (the local
cluster's TaskProlog sets the same netmod between its nodes)."""


clock = time.thread_time
"""Every cost is CPU seconds of the rank that pays it: on a machine shared with other work, wall-clock times count
the time a rank waited for a core; CPU seconds are what the operation costs a rank that has a core of its own."""


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def _report_message(actor: int, fragment: int, steps: int):
    """A fragment report as the actor sends it (runtime/roles/actor.py: _report), one finished episode."""
    from hpcrl.runtime.messages import Episode, FragmentReport

    episode = Episode(time=time.time(), actor=actor, env_index=0, episode_return=100.0, length=100, policy_version=1)
    return FragmentReport(time=time.time(), actor=actor, fragment=fragment, steps=steps, sample_seconds=0.01,
                          transport_wait_seconds=0.0, weight_sync_seconds=0.0, policy_version=1, group=0,
                          episodes=(episode,))


def summary_message(i: int, steps: int):
    """A node's summary (``actors.reports: summary``) of NODE_REPORTS actors with one fragment and one episode each,
    the ``i``-th fragment of each."""
    from hpcrl.runtime.messages import NodeSummary

    actors = np.arange(NODE_REPORTS, dtype=np.float64)
    ones = np.ones(NODE_REPORTS)
    return NodeSummary(node=2, actors=np.column_stack([actors, ones, ones * i, ones * steps, ones * 0.01]),
                       episodes=np.column_stack([actors, 0 * ones, 100 * ones, 100 * ones]), normalizers={},
                       rows=(NODE_REPORTS * (i + 1), NODE_REPORTS * (i + 1)))


def _worker(config: str, sizes: list[int], seconds: float, out: str) -> None:
    import torch
    from mpi4py import MPI

    from hpcrl.algos.adam import Adam
    from hpcrl.algos.outer_step import OuterStep
    from hpcrl.config import load_config
    from hpcrl.runtime.backoff import Backoff
    from hpcrl.runtime.messages import NodeReports
    from hpcrl.runtime.roles.sampler import describe_env
    from hpcrl.runtime.transport.channels import FragmentReceiver, FragmentSender
    from hpcrl.runtime.transport.layout import FragmentLayout
    from hpcrl.runtime.transport.links import MpiReports
    from hpcrl.runtime.transport.windows import GradientMailbox, WeightBoard
    from hpcrl.staleness import GradientRecord, make_policy

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != 3:
        raise SystemExit("scale-model's micro-run needs 3 ranks (parameter, learner, actor)")
    cfg = load_config(config)
    rows = {}
    for P in sizes:
        t: dict[str, list[float]] = {k: [] for k in ("push", "receive", "admit", "apply_gradient", "apply_update",
                                                      "publish", "fetch", "node_copy")}
        mb = GradientMailbox(comm, 0, 1, cfg.aggregation.mailbox_slots, P)
        board = WeightBoard(comm, 0, P, history=cfg.aggregation.weight_history)
        grad = np.full(P, 1e-3, dtype=np.float32)
        n = max(20, min(400, int(seconds / (2e-4 + 2e-8 * P))))
        if rank == 0:
            params = torch.zeros(P, requires_grad=True)
            params.grad = torch.zeros(P)
            adam = Adam([params], lr=1e-3)
            outer = OuterStep(params.detach(), lr=1.0)
            policy = make_policy(cfg.aggregation)
            version, queue, backoff = 0, [], Backoff(cap=1e-4)
            board.publish(version, params.detach().numpy())
            comm.Barrier()
            got = 0
            while got < n:
                s = clock()
                items = mb.poll()
                if not items:
                    backoff.sleep()
                    continue
                t["receive"].append((clock() - s) / len(items))
                for header, g in items:
                    got += 1
                    queue.append(GradientRecord(group=0, seq=header.seq, base_version=header.base_version,
                                                samples=header.samples, grad=g, stats={}, received_at=0.0))
                    s = clock()
                    adm = policy.admit(queue, version, 1)
                    t["admit"].append(clock() - s)
                    if adm is None:
                        continue
                    adm.remove_from(queue)
                    s = clock()
                    params.grad.copy_(torch.from_numpy(g))
                    adam.step()
                    t["apply_gradient"].append(clock() - s)
                    s = clock()
                    outer.step(torch.from_numpy(g))
                    t["apply_update"].append(clock() - s)
                    version += 1
                    s = clock()
                    board.publish(version, params.detach().numpy())
                    t["publish"].append(clock() - s)
            comm.Barrier()
        elif rank == 1:
            comm.Barrier()
            weights = np.empty(P, dtype=np.float32)
            have, waiting = -1, []
            for seq in range(n):
                s = clock()
                waited = mb.push(0, seq, max(have, 0), 1, grad)
                # this loop pushes faster than a learner, whose slot is mostly free when it pushes: the pushes that
                # found one free at once are the cost (all of them if too few did)
                (t["push"] if waited == 0.0 else waiting).append(clock() - s)
                have = board.read_latest(weights, have=have)  # the learner's read before its next minibatch
            if len(t["push"]) < 3:
                t["push"] += waiting
            comm.Barrier()
        else:
            comm.Barrier()
            weights, copy = np.empty(P, dtype=np.float32), np.empty(P, dtype=np.float32)
            have, backoff, done = -1, Backoff(cap=1e-4), False
            while not done:
                s = clock()
                v = board.read_latest(weights, have=have)
                if v != have:
                    t["fetch"].append(clock() - s)
                    have = v
                    s = clock()
                    np.copyto(copy, weights)  # what an actor pays to take its node's cached copy
                    t["node_copy"].append(clock() - s)
                else:
                    backoff.sleep()
                done = have >= n - 2 or len(t["fetch"]) >= n
            comm.Barrier()
        mb.free()
        board.free()
        rows[P] = comm.gather({k: v for k, v in t.items() if v}, root=0)
    # fragments (actor -> learner) and reports (actor -> rank 0), the job's fragment layout
    info = describe_env(cfg.env)
    layout = FragmentLayout(cfg.actors.fragment_length, cfg.env.num_envs, info.observation_space.shape,
                            np.dtype(info.observation_space.dtype), getattr(info.action_space, "shape", ()) or (),
                            np.int64 if hasattr(info.action_space, "n") else np.float32)
    reps = max(50, int(seconds / 2e-4))
    frag_s, report_s = float("nan"), []
    comm.Barrier()
    if rank == 2:
        sender, reports = FragmentSender(comm, layout, cfg.actors.max_in_flight), MpiReports(comm, 0)
        fragment = {k: v for k, v in layout.views(layout.empty()).items()}
        s = clock()
        for i in range(reps):
            sender.send(1, fragment)
            reports.send(_report_message(0, i, cfg.actors.fragment_length * cfg.env.num_envs))
        sender.close([1])
        frag_s = (clock() - s) / reps
        reports.close()
    elif rank == 1:
        receiver, backoff = FragmentReceiver(comm, layout), Backoff(cap=1e-4)
        while not receiver.finished([2]):
            if receiver.poll() is None:
                backoff.sleep()
        receiver.close()
    else:
        reports, taken, backoff = MpiReports(comm, 0), 0, Backoff(cap=1e-4)
        while taken < reps:
            s = clock()
            msgs = reports.drain()
            if msgs:
                report_s.append((clock() - s) / len(msgs))
                taken += len(msgs)
            else:
                backoff.sleep()
    frag_s = comm.bcast(frag_s, root=2)
    steps = cfg.actors.fragment_length * cfg.env.num_envs
    node_s = _node_messages(comm, max(20, reps // NODE_REPORTS), lambda i: NodeReports.of(
        2, [_report_message(j, i, steps) for j in range(NODE_REPORTS)]))
    summary_s = _node_messages(comm, max(20, reps // NODE_REPORTS), lambda i: summary_message(i, steps))
    if rank == 0:
        per_size = {}
        for P, parts in rows.items():
            merged = {}
            for part in parts:
                merged.update({k: _median(v) for k, v in part.items()})
            per_size[P] = merged
        each = max((_median(node_s) - _median(report_s)) / (NODE_REPORTS - 1), 0.0)
        Path(out).write_text(json.dumps({"sizes": per_size, "fragment_send": frag_s, "report": _median(report_s),
                                         "report_each": each, "report_summary": _median(summary_s),
                                         "fragment_bytes": layout.nbytes}))


def _node_messages(comm, n: int, message) -> list[float]:
    """Rank 2 sends rank 0 ``n`` node messages (``message(i)``: a NodeReports or NodeSummary of NODE_REPORTS actors);
    rank 0's CPU seconds per message taken in (empty on the other ranks)."""
    from hpcrl.runtime.backoff import Backoff
    from hpcrl.runtime.transport.links import MpiReports

    seconds: list[float] = []
    comm.Barrier()
    reports = MpiReports(comm, 0)
    if comm.Get_rank() == 2:
        for i in range(n):
            reports.send(message(i))
        reports.close()
    elif comm.Get_rank() == 0:
        taken, backoff = 0, Backoff(cap=1e-4)
        while taken < n:
            s = clock()
            msgs = reports.drain()
            if msgs:
                seconds.append((clock() - s) / len(msgs))
                taken += len(msgs)
            else:
                backoff.sleep()
    return seconds


def transport(config: str, sizes: list[int], seconds: float, tcp: bool, timeout: float = 600) -> dict:
    """Run the 3-rank micro-run (``tcp``: as if on three nodes); its medians as ``{"sizes": {P: {op: s}}, ...}``."""
    import tempfile

    mpiexec = Path(sys.executable).parent / "mpiexec"
    with tempfile.TemporaryDirectory(prefix="hpcrl-scale-") as tmp:
        out = Path(tmp) / "costs.json"
        cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", "3", sys.executable, "-m", "mpi4py", "-m",
               "hpcrl.bench.scale_measure", WORKER_FLAG, config, ",".join(map(str, sizes)), str(seconds), str(out)]
        env = dict(os.environ, UCX_LOG_LEVEL=os.environ.get("UCX_LOG_LEVEL", "error"), **(TCP_ENV if tcp else {}))
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError(f"scale-model: the micro-run did not end within {timeout:.0f} s")
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"scale-model: the micro-run failed ({proc.returncode}):\n{log[-2000:]}")
        got = json.loads(out.read_text())
    got["sizes"] = {int(k): v for k, v in got["sizes"].items()}
    return got


def time_case(step, seconds: float) -> float:
    """Median CPU seconds of ``step()`` over about ``seconds`` of CPU (after 3 warm-up calls)."""
    for _ in range(3):
        step()
    times, end = [], clock() + seconds
    while clock() < end or len(times) < 10:
        t = clock()
        step()
        times.append(clock() - t)
    return float(np.median(times))


def workload(config: str, overrides: list[str], seconds: float) -> tuple[Workload, dict]:
    """The job's sizes, and its actor's seconds per env step and learner's seconds per minibatch gradient (CPU)."""
    import torch

    from hpcrl.algos import make_algorithm
    from hpcrl.config import load_config
    from hpcrl.runtime.roles.sampler import VectorSampler, describe_env

    torch.set_num_threads(1)
    cfg = load_config(config, overrides)
    info = describe_env(cfg.env)
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    model = algo.make_model(info.observation_space, info.action_space)
    P = model.flat.params.numel()
    B, mb = cfg.algo.train_batch_size, cfg.algo.minibatch_size
    work = Workload(floats=P, batch_steps=B, minibatches=cfg.algo.num_sgd_iter * -(-B // mb),
                    fragment_steps=cfg.actors.fragment_length * cfg.env.num_envs)
    sampler = VectorSampler(cfg.env, 0, cfg.algo.gamma)
    T = cfg.actors.fragment_length
    actor_step = time_case(lambda: sampler.sample(algo, model, T, 0, 0), seconds) / (T * sampler.num_envs)
    # a real minibatch of one sampled batch, as a learner cuts it (every algorithm's columns: MARL's agent too)
    frags = [sampler.sample(algo, model, T, 0, 0)[0] for _ in range(max(1, -(-B // (T * sampler.num_envs))))]
    sampler.close()
    batch = next(iter(algo.minibatches(algo.prepare(frags, model), torch.Generator().manual_seed(0))))
    gradient = time_case(lambda: algo.compute_gradient(batch, model), seconds)
    return work, {"actor_step": actor_step, "gradient": gradient, "record_report": record_cost(cfg, seconds),
                  "record_node_report": record_cost(cfg, seconds, node=True),
                  "summary_handling": summary_cost(cfg, seconds), "node_pack": node_pack_cost(cfg, seconds),
                  **per_step_costs(cfg, algo, model, info, seconds)}


def record_cost(cfg, seconds: float, node: bool = False) -> float:
    """Rank 0's record work per fragment report, CPU seconds, marginal (hpcrl.bench.record_cost's: opening run.h5 and
    its first flush do not count; the half-second flushes do): ``RunRecord.fragment`` of a report with one episode
    (its actors and episodes rows, the round's statistics); ``node``: ``RunRecord.fragments`` of node messages'
    columns (NODE_REPORTS reports each)."""
    from hpcrl.bench.record_cost import marginal_seconds, measure

    n = NODE_REPORTS * max(100, int(seconds / 1e-4))
    if node:
        return measure([NODE_REPORTS], n)[NODE_REPORTS] / 1e6
    report = _report_message(0, 0, cfg.actors.fragment_length * cfg.env.num_envs)
    return marginal_seconds(lambda record: record.fragment(report, 0), 1, n, cfg.io, cfg.stop)


def summary_cost(cfg, seconds: float) -> float:
    """Rank 0's work on one node's summary once taken in (``FragmentHandlers.summary``: the elastic rule and the actor
    ledger per actor, ``RunRecord.node_summary``), CPU seconds: a summary of NODE_REPORTS actors
    (:func:`summary_message`), the record's round ended every 100 messages."""
    import tempfile
    from types import SimpleNamespace

    from hpcrl.runtime.record.run_record import RunRecord
    from hpcrl.runtime.record.stop_rule import StopRule
    from hpcrl.runtime.roles.actor_ledger import ActorLedger
    from hpcrl.runtime.roles.elastic import ElasticRule
    from hpcrl.runtime.roles.fragment_handlers import FragmentHandlers
    from hpcrl.runtime.topology import one_process_rank_map

    messages = [summary_message(i, cfg.actors.fragment_length * cfg.env.num_envs) for i in range(100)]
    with tempfile.TemporaryDirectory(prefix="hpcrl-summary-cost-") as tmp:
        record = RunRecord.create(Path(tmp), cfg.io, "name: summary-cost\n", one_process_rank_map(),
                                  StopRule(cfg.stop), {})
        groups = SimpleNamespace(rule=ElasticRule(1, 1, 0.1, 10.0))
        handlers = FragmentHandlers(groups, ActorLedger(NODE_REPORTS), record, lambda: 0, lambda message: None)
        count = [0]

        def take() -> None:
            handlers.summary(messages[count[0] % 100])
            count[0] += 1
            if count[0] % 100 == 0:
                record.end_round(count[0] // 100, 0, active=1)

        cost = time_case(take, seconds)
        record.close()
    return cost


def node_pack_cost(cfg, seconds: float) -> float:
    """A node's relay making one summary (``NodeRows.pack``): NODE_REPORTS reports' rows (one episode each) appended
    to its node file and the file flushed, CPU seconds per summary."""
    import tempfile

    from hpcrl.runtime.clock import WALL
    from hpcrl.runtime.record.node_rows import NodeRows
    from hpcrl.runtime.transport.report_packing import FLUSH_SECONDS

    batch = [_report_message(j, 0, cfg.actors.fragment_length * cfg.env.num_envs) for j in range(NODE_REPORTS)]
    with tempfile.TemporaryDirectory(prefix="hpcrl-node-pack-") as tmp:
        rows = NodeRows(Path(tmp), 2, cfg.io.compression, lambda: 0, WALL, FLUSH_SECONDS)
        cost = time_case(lambda: rows.pack(2, batch), seconds)
        rows.close()
    return cost


def per_step_costs(cfg, algo, model, info, seconds: float) -> dict:
    """A learner's batch preparation (``algo.prepare``: PPO's GAE) and an actor's trajectory write, per env step
    (the virtual-time runner's ``prepare_per_step`` and ``record_per_step``)."""
    import tempfile

    from hpcrl.io import TrajLayout, TrajectoryWriter
    from hpcrl.runtime.roles.sampler import VectorSampler, bootstrap_values

    sampler = VectorSampler(cfg.env, 0, cfg.algo.gamma)
    T = cfg.actors.fragment_length
    frags = [sampler.sample(algo, model, T, 0, 0)[0]
             for _ in range(max(1, -(-cfg.algo.train_batch_size // (T * sampler.num_envs))))]
    sampler.close()
    steps = sum(f["rewards"].size for f in frags)
    prepare = time_case(lambda: algo.prepare(frags, model), seconds) / steps
    f = frags[0]
    layout = TrajLayout(obs_shape=tuple(info.observation_space.shape), action_shape=tuple(model.action_shape),
                        obs_dtype=info.obs_dtype.str.lstrip("<>=|"), action_dtype="i8" if model.discrete else "f4",
                        num_envs=sampler.num_envs)
    with tempfile.TemporaryDirectory(prefix="hpcrl-record-cost-") as tmp:
        writer = TrajectoryWriter(Path(tmp) / "actor.h5", layout, cfg.io.compression, actor=0,
                                  flush_seconds=cfg.io.flush_seconds)

        def record() -> None:
            writer.append_fragment(f["obs"], f["actions"], f["rewards"], f["terminated"], f["truncated"],
                                   f["behaviour_logp"], f["values"], 0, bootstrap_values(f))
            writer.maybe_flush()

        record_seconds = time_case(record, seconds) / f["rewards"].size
        writer.close()
    return {"prepare_per_step": prepare, "record_per_step": record_seconds}


def costs_from(measured: dict, steps: dict) -> Costs:
    """A micro-run's medians (and the workload's) as the model's costs, fitted over the weight sizes."""
    sizes = sorted(measured["sizes"])

    def fit(op: str) -> Linear:
        return Linear.fit(sizes, [measured["sizes"][P][op] for P in sizes])

    return Costs(push=fit("push"), receive=fit("receive"), admit=fit("admit").fixed,
                 apply_gradient=fit("apply_gradient"), apply_update=fit("apply_update"), publish=fit("publish"),
                 fetch=fit("fetch"), node_copy=fit("node_copy"), fragment_send=measured["fragment_send"],
                 report=measured["report"], actor_step=steps["actor_step"], gradient=steps["gradient"],
                 report_each=measured.get("report_each", 0.0), record=steps.get("record_report", 0.0),
                 record_node=steps.get("record_node_report"),
                 summary=(measured["report_summary"] + steps["summary_handling"]
                          if "report_summary" in measured and "summary_handling" in steps else None),
                 node_pack=steps.get("node_pack", 0.0))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == WORKER_FLAG:
        _worker(sys.argv[2], [int(s) for s in sys.argv[3].split(",")], float(sys.argv[4]), sys.argv[5])
    else:
        raise SystemExit("usage: hpcrl bench scale-model (this module is its micro-run)")
