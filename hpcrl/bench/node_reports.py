"""Per-node reports (``actors.reports``): rank 0's CPU per env step for the actors' reports, per fragment vs per node
vs per-node summaries.

One ``mpiexec -n A+1`` per mode: rank 0 drains reports as the parameter rank does (``MpiReports.drain``, one read of
the env-step counter per message whose fragments ended episodes, each report looked at); ranks 1 .. A are actors on
``--nodes`` nodes (``comm.Split`` by ``(rank - 1) % nodes``), each sending ``--reports`` fragment reports shaped as
the job's (its ``VectorSampler``'s normalisation statistics, ``--episodes`` ended episodes) one every ``--pace-ms``
(its fragment's sampling), straight to rank 0 (``fragment``) or through its node's relay (``node``,
runtime/transport/node_reports.py), or through its node's relay, which writes the rows to its node file and sends
rank 0 their sums (``summary``, runtime/record/node_rows.py). CPU is rank 0's thread CPU in the drains that got
something (an empty poll is waiting, the same in every mode), per env step; apart from it, the record's work per report
(into a run.h5 in a temporary directory, with its flushes): ``RunRecord.fragment`` of each report,
``RunRecord.fragments`` of a node message's columns, or ``RunRecord.node_summary`` of a summary (whose rows the
relays wrote: their CPU for it, ``NodeRows.pack``, is the last column).

usage: hpcrl bench node-reports [--config cartpole.yaml] [--actors 8] [--nodes 2] [--reports 300] [--pace-ms 5]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from hpcrl.bench.mpi_worker import WorkerFailed, run_worker

WORKER_FLAG = "--mpi-worker"
MODES = ("fragment", "node", "summary")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpcrl bench node-reports", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "cartpole.yaml"),
                   help="the job whose env and fragment the reports are shaped as")
    p.add_argument("--actors", type=int, default=8)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--reports", type=int, default=300, help="reports per actor")
    p.add_argument("--pace-ms", type=float, default=5.0, help="an actor's milliseconds between two reports")
    p.add_argument("--episodes", type=int, default=1, help="episodes a fragment ends")
    p.add_argument("--tcp", action="store_true", help="the ranks as if on different nodes (OFI over TCP)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for each MPI job")
    return p.parse_args(argv)


def _report(actor: int, fragment: int, steps: int, episodes: int, normalizer):
    from hpcrl.runtime.messages import Episode, FragmentReport

    now = time.time()
    ended = tuple(Episode(time=now, actor=actor, env_index=e, episode_return=100.0, length=100, policy_version=1)
                  for e in range(episodes))
    return FragmentReport(time=now, actor=actor, fragment=fragment, steps=steps, sample_seconds=0.01,
                          transport_wait_seconds=0.0, weight_sync_seconds=0.0, policy_version=1, group=0,
                          episodes=ended, normalizer=normalizer)


class _TimedPacking:
    """A relay's packing, its CPU counted."""

    def __init__(self, rows) -> None:
        self.rows, self.cpu = rows, 0.0
        self.every_actor, self.flush_seconds = rows.every_actor, rows.flush_seconds

    def pack(self, relay, batch):
        t = time.thread_time()
        message = self.rows.pack(relay, batch)
        self.cpu += time.thread_time() - t
        return message

    def close(self) -> None:
        self.rows.close()


def _worker(mode: str, config: str, nodes: int, n: int, pace: float, episodes: int) -> None:
    from mpi4py import MPI

    from hpcrl.config import load_config
    from hpcrl.runtime.clock import WALL
    from hpcrl.runtime.messages import NodeReports, NodeSummary
    from hpcrl.runtime.record.node_rows import NodeRows
    from hpcrl.runtime.record.run_record import RunRecord
    from hpcrl.runtime.record.stop_rule import StopRule
    from hpcrl.runtime.topology import one_process_rank_map
    from hpcrl.runtime.roles.sampler import VectorSampler
    from hpcrl.runtime.transport.control import wait_request
    from hpcrl.runtime.transport.links import MpiReports
    from hpcrl.runtime.transport.node_reports import ReportMember, ReportRelay
    from hpcrl.runtime.transport.report_packing import FLUSH_SECONDS
    from hpcrl.runtime.transport.windows import CounterWindow

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    cfg = load_config(config, ["io.loggers=[]"])
    steps = cfg.actors.fragment_length * cfg.env.num_envs
    counters = CounterWindow(comm, 0, 1, initial=0)
    node = comm.Split((rank - 1) % nodes if rank else MPI.UNDEFINED, rank)
    pack_cpu = 0.0  # a summary relay's CPU making its messages (its node file's rows)
    if rank:
        sampler = VectorSampler(cfg.env, rank - 1, gamma=0.99)
        normalizer = sampler.normalizer_state()
        with tempfile.TemporaryDirectory(prefix="hpcrl-node-rows-") as tmp:
            rows = _TimedPacking(NodeRows(Path(tmp), rank, cfg.io.compression, lambda: counters.read(0), WALL,
                                            FLUSH_SECONDS))
            if mode == "fragment":
                reports = MpiReports(comm)
            elif node.Get_rank() == 0:
                reports = ReportRelay(node, MpiReports(comm), rank, lambda: None,
                                      packing=rows if mode == "summary" else None)
            else:
                reports = ReportMember(node, lambda: None)
            comm.Barrier()
            for i in range(n):
                reports.send(_report(rank - 1, i, steps, episodes, normalizer))
                time.sleep(pace)
            reports.close()
            pack_cpu = rows.cpu
        sampler.close()
        wait_request(comm.Ibarrier())
    else:
        reports = MpiReports(comm)
        with tempfile.TemporaryDirectory(prefix="hpcrl-node-reports-") as tmp:
            record = RunRecord.create(Path(tmp), cfg.io, "", one_process_rank_map(), StopRule(cfg.stop), {})
            comm.Barrier()
            done, cpu, rows, messages, taken = comm.Ibarrier(), 0.0, 0.0, 0, 0
            while True:
                finished = done.Test()
                t = time.thread_time()
                got = reports.drain()
                if got:
                    r0 = time.thread_time()
                    cpu += r0 - t
                    for m in got:  # what rank 0's FragmentHandlers do, less the elastic rule and the ledger
                        if isinstance(m, NodeSummary):
                            record.node_summary(m)
                            taken += int(m.actor_sum("fragments").sum())
                        elif isinstance(m, NodeReports):
                            f = m.fragments
                            record.fragments(f.actors, f.episodes, counters.read(0) if len(f.episodes["actor"]) else 0)
                            taken += len(f)
                        else:
                            record.fragment(m, counters.read(0) if m.episodes else 0)
                            taken += 1
                    record.maybe_flush()
                    rows += time.thread_time() - r0
                    messages += len(got)
                elif finished:
                    break
                else:
                    time.sleep(2e-5)
            r0 = time.thread_time()
            record.flush()  # the last rows written (closing the file is not per report)
            rows += time.thread_time() - r0
            record.close()
    pack_cpu = comm.reduce(pack_cpu, root=0)
    if rank == 0:
        expected = (comm.Get_size() - 1) * n
        if taken != expected:
            raise SystemExit(f"node-reports: rank 0 took {taken} reports of {expected}")
        print(f"RESULT {mode} {messages} {taken} {cpu:.6f} {taken * steps} {rows:.6f} {pack_cpu:.6f}", flush=True)
    comm.Barrier()
    counters.free()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if WORKER_FLAG in argv:
        argv.remove(WORKER_FLAG)
        mode, config, nodes, n, pace, episodes = argv
        _worker(mode, config, int(nodes), int(n), float(pace), int(episodes))
        return 0
    args = _parse(argv)
    from hpcrl.bench.scale_measure import TCP_ENV

    rows = {}
    for mode in MODES:
        try:
            out = run_worker(args.actors + 1, "hpcrl.bench.node_reports",
                             [WORKER_FLAG, mode, args.config, str(args.nodes), str(args.reports),
                              str(args.pace_ms / 1e3), str(args.episodes)], args.timeout,
                             f"node-reports: the {mode} job", TCP_ENV if args.tcp else None)
        except WorkerFailed as exc:
            print(exc, file=sys.stderr)
            return 1
        _, _, messages, taken, cpu, steps, record, pack = next(
            l for l in out.splitlines() if l.startswith("RESULT")).split()
        rows[mode] = (int(messages), int(taken), float(cpu), int(steps), float(record), float(pack))
    print(f"{'reports':>8} {'actors':>6} {'nodes':>5} {'messages':>8} {'reports/msg':>11} {'rank 0 us/msg':>13} "
          f"{'rank 0 us/report':>16} {'rank 0 ns/env step':>18} {'vs fragment':>11} {'+ record us/report':>18} "
          f"{'total ns/env step':>17} {'vs fragment':>11} {'relays us/report':>16}")
    base, base_all = (rows["fragment"][2] / rows["fragment"][3],
                      (rows["fragment"][2] + rows["fragment"][4]) / rows["fragment"][3])
    for mode, (messages, taken, cpu, steps, record, pack) in rows.items():
        print(f"{mode:>8} {args.actors:>6} {args.nodes:>5} {messages:>8} {taken / messages:>11.1f} "
              f"{1e6 * cpu / messages:>13.1f} {1e6 * cpu / taken:>16.2f} {1e9 * cpu / steps:>18.1f} "
              f"{cpu / steps / base:>10.2f}x {1e6 * record / taken:>18.2f} {1e9 * (cpu + record) / steps:>17.1f} "
              f"{(cpu + record) / steps / base_all:>10.2f}x {1e6 * pack / taken:>16.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
