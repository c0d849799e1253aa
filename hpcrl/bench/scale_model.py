"""Scale model: per-operation costs measured here -> env steps/s, pushes/s and rank 0's load at 1 to 1,000 nodes.

Measures the operations of the gradient and weight paths with the runtime's own objects in a 3-rank MPI
micro-run (``scale_measure.py``: mailbox push, receive + admission + apply, publish, weight fetch, fragment
send, fragment report) at several weight sizes, and the job's actor env step and learner minibatch gradient in
this process; feeds them to the model (``scale_predict.py``) for a Perlmutter-like layout (64 actors per CPU
node, 4 learner ranks per GPU node) under gradient and update push and per-actor and per-node weight fetch,
and says at how many nodes the single parameter rank saturates. ``--check-cluster`` also submits the same
job to 1, 2 and 3 nodes of the local Slurm cluster (scripts/local_cluster.sh) and sets the model's prediction
for that layout (every rank on this machine's cores, TCP between nodes) beside what the runs measured.

    hpcrl bench scale-model [--config FILE] [-o KEY=VALUE ...] [--sizes job,262144,1048576] [--seconds 0.5]
                            [--nodes 1,2,4,...,1000] [--large P,B,M,F] [--gpu-share 0.5] [--gpu-gradient-ms 0.43] [--nic-gbs 25]
                            [--check-cluster [--cluster-nodes 1,2,3] [--actors-per-node 2] [--steps 30000]
                             [--push gradient,update]] [--tcp] [--costs FILE] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from hpcrl.bench.scale_predict import (FETCH_MODES, PUSH_MODES, Costs, Interconnect, Layout, Linear, Workload, blend,
                                       fmt_rate, per_env_step, perlmutter, predict, saturation_nodes, scaling_efficiency)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NODES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
H200_GRAPH_GRADIENT_MS = 0.43
"""A CartPole/Hopper minibatch gradient replayed from a CUDA graph on an H200 (docs/results/runtime.md)."""


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def print_costs(title: str, costs: Costs, work: Workload) -> None:
    P = work.floats
    print(f"{title} (ms per operation at P = {P:,} floats and at 1M floats; fixed + per-float fit over the sizes)")
    for name, value in asdict(costs).items():
        if isinstance(value, dict):  # a Linear
            at = lambda n: 1e3 * (value["fixed"] + value["per_float"] * n)  # noqa: E731
            rate = f" ({4e-9 / value['per_float']:.2f} GB/s)" if value["per_float"] else ""
            print(f"  {name:15s} {at(P):9.4f} {at(1 << 20):9.3f}   = {1e3 * value['fixed']:.4f} ms + "
                  f"{1e9 * value['per_float']:.3f} ns/float{rate}")
        elif value is not None:  # None: a cost an older costs file does not hold
            print(f"  {name:15s} {1e3 * value:9.4f}")


LARGE = "1048576,65536,64,128"
"""A large job for the table beside the measured one: P (4 MB of weights), B, M (4 epochs of 16 minibatches), F."""
VARIANTS = [("update push, per-node fetch (built)", {}),
            ("+ sync admission", {"admission": "sync"}),
            ("+ sync admission and node combine (a GPU node's 4 pushes summed on the node)",
             {"admission": "sync", "combine": 4}),
            ("+ 4 parameter shards", {"shards": 4}),
            ("+ 16 parameter shards", {"shards": 16}),
            ("+ sync admission, node combine and 16 shards", {"admission": "sync", "combine": 4, "shards": 16})]


def table(title: str, costs: Costs, work: Workload, nodes: list[int], gpu_share: float, nic: float) -> None:
    layout_of = lambda n: perlmutter(n, gpu_share, nic_bytes_per_s=nic)  # noqa: E731
    print(f"\n{title}: P = {work.floats:,} floats, B = {work.batch_steps:,}, M = {work.minibatches}, "
          f"F = {work.fragment_steps}. Perlmutter-like layout: {gpu_share:.0%} GPU nodes (4 learner ranks each, rank 0 "
          f"on the first), the rest CPU nodes of 64 actors; rank 0's link {nic / 1e9:.0f} GB/s; a GPU learner's gradient "
          f"{1e3 * costs.gradient:.2f} ms. Per push mode / fetch mode: env steps/s, pushes/s into rank 0, rank 0's busy "
          f"share, rank 0's outgoing weight bytes/s, the bottleneck:")
    modes = [(p, f) for p in PUSH_MODES for f in FETCH_MODES]
    print(f"{'nodes':>5} {'actors':>6} {'lrn':>4} | " + " | ".join(f"{p + '/' + f:^39}" for p, f in modes))
    for n in nodes:
        lay = layout_of(n)
        cells = []
        for p, f in modes:
            r = predict(costs, work, lay, p, f)
            cells.append(f"{fmt_rate(r.env_steps_per_s):>6} {fmt_rate(r.pushes_per_s):>6} {min(r.rank0_busy, 9.99):>4.2f} "
                         f"{fmt_rate(r.rank0_out_bytes_per_s) + 'B':>7} {r.bottleneck[:11]:>11}")
        print(f"{n:>5} {lay.actors:>6} {lay.learners:>4} | " + " | ".join(cells))
    print("where the single parameter rank becomes the bottleneck (fewest nodes; rank 0 CPU or its link), and what "
          "it then allows:")
    for p, f in modes:
        saturation(costs, work, layout_of, f"{p} push, per-{f} fetch", p, f)
    print("on top of update push and per-node fetch:")
    for name, variant in VARIANTS:
        saturation(costs, work, layout_of, name, "update", "node", **variant)


EFFICIENCY_NODES = [2, 8, 64, 256, 1000, 4000]
TOPOLOGY_VARIANTS = [
    ("gradient push, per-actor fetch (built)", {"push": "gradient", "fetch": "actor"}),
    ("update push, per-node fetch (built)", {"push": "update", "fetch": "node"}),
    ("update push, sync, per-node fetch and reports", {"push": "update", "fetch": "node", "reports": "node",
                                                       "admission": "sync"}),
    ("+ node combine", {"push": "update", "fetch": "node", "reports": "node", "admission": "sync", "combine": 4}),
    ("+ node combine and 16 shards", {"push": "update", "fetch": "node", "reports": "node", "admission": "sync",
                                      "combine": 4, "shards": 16}),
    ("allreduce (DD-PPO-like), per-node fetch", {"topology": "allreduce", "fetch": "node"}),
    ("allreduce, per-node fetch and reports", {"topology": "allreduce", "fetch": "node", "reports": "node"}),
    ("+ node combine, 16 shards, per-node summaries", {"push": "update", "fetch": "node", "reports": "summary",
                                                       "admission": "sync", "combine": 4, "shards": 16}),
    ("allreduce, per-node fetch and summaries", {"topology": "allreduce", "fetch": "node", "reports": "summary"}),
    ("+ node combine, 16 shards, summaries, tree 16", {"push": "update", "fetch": "node", "reports": "summary",
                                                       "admission": "sync", "combine": 4, "shards": 16, "tree": 16}),
    ("allreduce, summaries, weight tree 16", {"topology": "allreduce", "fetch": "node", "reports": "summary",
                                              "tree": 16}),
]
"""The ways to train at scale the efficiency tables compare (per-node summaries: actors.reports=summary, given costs
that measured it; tree 16: launch.weight_tree=16)."""


def efficiency_table(title: str, costs: Costs, work: Workload, gpu_share: float, nic: float, net: Interconnect,
                     nodes: list[int] = EFFICIENCY_NODES) -> None:
    """Scaling efficiency of each way to train at scale: env steps/s at N nodes over N x the 2-node rate per node,
    and the bottleneck at the largest N."""
    layout_of = lambda n: perlmutter(n, gpu_share, nic_bytes_per_s=nic)  # noqa: E731
    print(f"\n{title}, scaling efficiency (env steps/s at N nodes over N x the per-node rate of 2 nodes, one GPU and "
          f"one CPU node); allreduce over Slingshot-like links of {net.node_bytes_per_s / 1e9:.0f} GB/s per learner node, "
          f"{net.latency * 1e6:.1f} us per message:")
    print(f"  {'':50s} " + " ".join(f"{n:>13,}" for n in nodes) + "  bottleneck at the last")
    for name, variant in TOPOLOGY_VARIANTS:
        if variant.get("reports") == "summary" and costs.summary is None:
            continue  # a costs file from before summaries were built
        cells = []
        for n in nodes:
            rate, eff = scaling_efficiency(costs, work, n, layout_of, net=net, **variant)
            cells.append(f"{fmt_rate(rate):>6} {min(eff, 9.99):>5.0%}")
        last = predict(costs, work, layout_of(nodes[-1]), net=net, **variant).bottleneck
        print(f"  {name:50s} " + " ".join(cells) + f"  {last}")


def saturation(costs: Costs, work: Workload, layout_of, name: str, push: str, fetch: str, **variant) -> None:
    at = saturation_nodes(costs, work, push, fetch, layout_of, **variant)
    big = predict(costs, work, layout_of(1000), push, fetch, **variant)
    head = f"  {name:70s}"
    if at is None:
        print(f"{head} not below 1,000,000 nodes; at 1,000 nodes {fmt_rate(big.env_steps_per_s)} env steps/s "
              f"({big.bottleneck})")
        return
    r = predict(costs, work, layout_of(at), push, fetch, **variant)
    print(f"{head} {at:>7,} nodes ({r.bottleneck}): {fmt_rate(r.env_steps_per_s)} env steps/s, "
          f"{fmt_rate(r.pushes_per_s)} pushes/s, {fmt_rate(r.rank0_out_bytes_per_s)}B/s out; at 1,000 nodes "
          f"{fmt_rate(big.env_steps_per_s)} ({big.bottleneck})")


# ---- the local cluster -------------------------------------------------------------------------
def submit(config: str, nodes: int, actors: int, steps: int, push: str, run_dir: Path, extra: list[str]) -> str:
    sets = [f"actors.count={actors}", f"learners.push={push}", f"stop.total_env_steps={steps}",
            "stop.target_return=null", "io.log_seconds=600", *extra]
    cmd = [sys.executable, "-m", "hpcrl", "submit", "--site", "local-cluster", "--nodes", str(nodes),
           "--run-dir", str(run_dir), config, *[a for o in sets for a in ("-o", o)]]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=run_dir.parent)
    if res.returncode != 0 or not res.stdout.strip():
        raise RuntimeError(f"hpcrl submit failed ({res.returncode}): {res.stderr.strip()[-1000:]}")
    return res.stdout.strip().split()[-1]


def wait_job(job_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
        m = re.search(r"\bJobState=(\S+)", out)
        if m and m[1] in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}:
            return m[1]
        time.sleep(2)
    subprocess.run(["scancel", job_id], timeout=30)
    return "TIMEOUT (cancelled by the bench)"


def placement(run_h5: Path) -> dict:
    """Nodes of the run, and the share of its actors on another node than rank 0 (from ``rank_map``)."""
    from hpcrl.io import read_table

    ranks = read_table(run_h5, "rank_map")
    nodes = [n.decode() for n in ranks["node"]]
    home = nodes[list(ranks["role"]).index(0)]
    actors = [node for role, node in zip(ranks["role"], nodes) if role == 2]
    return {"nodes": sorted(set(nodes)), "actor_nodes": len(set(actors)),
            "remote_share": sum(a != home for a in actors) / max(len(actors), 1)}


def job_cpu(job_id: str) -> tuple[float, float]:
    """(CPU seconds, elapsed seconds) of the job's step 0 (the ranks), from sacct."""
    out = subprocess.run(["sacct", "-j", f"{job_id}.0", "-n", "-P", "-o", "TotalCPU,ElapsedRaw"], capture_output=True,
                         text=True, timeout=30).stdout.split()
    if not out:
        return float("nan"), float("nan")
    cpu, elapsed = out[0].split("|")
    return sacct_seconds(cpu), float(elapsed)


def sacct_seconds(text: str) -> float:
    """sacct's TotalCPU ([D-][HH:]MM:SS[.mmm]) in seconds."""
    days, _, clock = text.rpartition("-")
    return sum(float(x) * 60 ** i for i, x in enumerate(reversed(clock.split(":")))) + 86400 * float(days or 0)


def cluster_runs(config: str, overrides: list[str], args) -> list[dict]:
    """Submit the job per push mode and node count (a run already in ``--cluster-dir`` is kept); wait for each."""
    out = Path(args.cluster_dir or tempfile.mkdtemp(prefix="hpcrl-scale-cluster-", dir=Path.cwd())).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    # a short job per node count first: its CPU seconds are the start-up and shutdown the long jobs' CPU includes
    for push, steps in [("short", args.short_steps), *((push, args.steps) for push in args.push)]:
        for n in args.cluster_nodes:
            run_dir, id_file = out / f"{push}-n{n}", out / f"{push}-n{n}.jobid"
            if not id_file.exists():
                print(f"local cluster: {n} node(s), {args.actors_per_node * n} actors, push {push}, {steps} env "
                      "steps ...", file=sys.stderr, flush=True)
                load = os.getloadavg()[0]
                job = submit(config, n, args.actors_per_node * n, steps, "gradient" if push == "short" else push,
                             run_dir, overrides)
                id_file.write_text(f"{job} {load:.1f}\n")
                wait_job(job, args.job_timeout)
            job, load = id_file.read_text().split()
            runs.append({"push": push, "nodes": n, "job": job, "run_dir": str(run_dir), "load": float(load)})
    return runs


def cluster_table(runs: list[dict], local: Costs, remote: Costs, work: Workload, args) -> list[dict]:
    """Each cluster run measured (run.h5, sacct) beside the model's prediction for its placement."""
    from hpcrl.bench.update_push import measure

    rows, startup = [], {}
    for run in runs:
        if run["push"] == "short":  # CPU seconds that are not training: start-up, shutdown, the short job's steps
            got = measure(Path(run["run_dir"])) if (Path(run["run_dir"]) / "run.h5").exists() else None
            startup[run["nodes"]] = (job_cpu(run["job"])[0], got["env_steps"]) if got else (float("nan"), 0)
            continue
        run_dir = Path(run["run_dir"])
        if not (run_dir / "run.h5").exists():
            rows.append({**run, "state": "no run.h5"})
            continue
        got, where = measure(run_dir), placement(run_dir / "run.h5")
        cpu, elapsed = job_cpu(run["job"])
        n = run["nodes"]
        base_cpu, base_steps = startup.get(n, (float("nan"), 0))
        lay = Layout(nodes=n, actors=args.actors_per_node * n, actor_nodes=where["actor_nodes"], learners=1,
                     cores=args.cores)
        costs = blend(local, remote, where["remote_share"])
        pred = predict(costs, work, lay, run["push"], "actor")
        got_cores = (cpu - base_cpu) / got["train_seconds"]  # the cores the job's training got (others share them)
        pred_got = predict(costs, work, replace(lay, cores=got_cores), run["push"], "actor")
        need = per_env_step(costs, work, lay, run["push"], "actor")
        train_cpu_ms = 1e3 * (cpu - base_cpu) / (got["env_steps"] - base_steps)
        rows.append({**run, "state": "done", "where": where, "measured": got, "cpu_seconds": cpu, "elapsed": elapsed,
                     "startup_cpu_seconds": base_cpu, "train_cpu_ms_per_step": train_cpu_ms,
                     "predicted": asdict(pred), "predicted_at_cores_got": asdict(pred_got), "cores_got": got_cores,
                     "model_ms_per_step": {k: 1e3 * need[k] for k in ("actor", "learner", "rank0")}})
    print(f"\nlocal cluster (scripts/local_cluster.sh: every node a namespace on this machine's {os.cpu_count()} cores), "
          f"{args.actors_per_node} actors per node, 1 learner, {args.steps:,} env steps per job. Measured from each "
          "run's run.h5 and sacct; predicted by the model for the run's placement (rank_map):")
    print(f"{'push':8} {'nodes':>5} {'actors':>6} {'remote':>6} | {'env steps/s: meas':>17} {'pred 2 cores':>12} "
          f"{'cores got':>9} {'pred at got':>11} | {'CPU ms/step: meas':>17} {'pred':>5} | "
          f"{'rank 0 ms/1k steps: meas':>24} {'pred':>5} | {'pushes/1k':>9} {'pred':>5} | {'load':>4}")
    for r in rows:
        if r["state"] != "done":
            print(f"{r['push']:8} {r['nodes']:>5} job {r['job']}: {r['state']}")
            continue
        m, p, pg, ms = r["measured"], r["predicted"], r["predicted_at_cores_got"], r["model_ms_per_step"]
        print(f"{r['push']:8} {r['nodes']:>5} {args.actors_per_node * r['nodes']:>6} {r['where']['remote_share']:>6.0%} | "
              f"{m['steps_per_s']:>17,.0f} {p['env_steps_per_s']:>12,.0f} {r['cores_got']:>9.2f} "
              f"{pg['env_steps_per_s']:>11,.0f} | {r['train_cpu_ms_per_step']:>17.3f} {sum(ms.values()):>5.3f} | "
              f"{m['rank0_ms_per_1k_steps']:>24.0f} {1e3 * ms['rank0']:>5.0f} | "
              f"{1e3 * m['pushes_per_s'] / m['steps_per_s']:>9.1f} {1e3 * p['pushes_per_s'] / p['env_steps_per_s']:>5.1f} | "
              f"{r['load']:>4.1f}")
    print("(remote: share of the actors on another node than rank 0 and the learner; cores got: the job's CPU seconds "
          "less the short job's, over its training seconds; CPU ms/step measured: "
          "sacct TotalCPU of the job less that of a short job on as many nodes (start-up, shutdown), over the env steps "
          "between them; load: the machine's load average at submit)")
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench scale-model", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(CONFIGS / "cartpole.yaml"), help="the job (default: the default job)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--sizes", default="job,262144,1048576", help="weight sizes in floats for the micro-run ('job': its own)")
    p.add_argument("--seconds", type=float, default=0.5, help="time per measured operation and size")
    p.add_argument("--nodes", type=ints, default=NODES, help="node counts of the Perlmutter-like table")
    p.add_argument("--gpu-share", type=float, default=0.5, help="share of the nodes that are GPU (learner) nodes")
    p.add_argument("--gpu-gradient-ms", type=float, default=H200_GRAPH_GRADIENT_MS,
                   help="a GPU learner's minibatch gradient in the table (default: the H200 CUDA-graph figure)")
    p.add_argument("--large", default=LARGE, help="P,B,M,F of a second job for the table (default %(default)s)")
    p.add_argument("--nic-gbs", type=float, default=25.0, help="rank 0's link in GB/s (Slingshot-11: 25)")
    p.add_argument("--learner-node-gbs", type=float, default=100.0,
                   help="a learner node's links for allreduce, GB/s (Perlmutter GPU node: 4 x 25)")
    p.add_argument("--net-latency-us", type=float, default=3.0, help="latency per message between nodes, us")
    p.add_argument("--check-cluster", action="store_true", help="also run the job on 1, 2, 3 local cluster nodes")
    p.add_argument("--cluster-nodes", type=ints, default=[1, 2, 3])
    p.add_argument("--actors-per-node", type=int, default=2)
    p.add_argument("--steps", type=int, default=30_000, help="env steps per cluster job")
    p.add_argument("--short-steps", type=int, default=2048, help="env steps of the start-up job per node count")
    p.add_argument("--push", type=lambda s: [x for x in s.split(",") if x], default=list(PUSH_MODES))
    p.add_argument("--cores", type=float, default=float(os.cpu_count() or 1), help="cores the cluster's ranks share")
    p.add_argument("--job-timeout", type=float, default=600.0)
    p.add_argument("--cluster-dir", help="keep the cluster runs here (default: a new folder under the current one); "
                   "a run of the same push mode and nodes already there is read, not submitted again")
    p.add_argument("--tcp", action="store_true", help="also measure the costs as between nodes (OFI over TCP)")
    p.add_argument("--costs", help="take the workload and costs from an earlier --json instead of measuring")
    p.add_argument("--json", help="write the costs, tables' inputs and cluster rows here")
    args = p.parse_args(argv)
    if any(m not in PUSH_MODES for m in args.push):
        p.error(f"--push: allowed {', '.join(PUSH_MODES)}")
    if args.costs:
        work, local, remote = load_costs(Path(args.costs))
        if args.check_cluster and remote is None:
            p.error("--check-cluster needs the TCP costs: leave out --costs, or give a --json that has them")
    else:
        work, local, remote = measure_costs(args)
    print_costs("costs on this machine, ranks on one node (shared memory)", local, work)
    if remote is not None:
        print_costs("costs with the ranks as on different nodes (OFI netmod over TCP, no shared memory)", remote, work)
    gpu = replace(local, gradient=args.gpu_gradient_ms * 1e-3)
    net = Interconnect(latency=args.net_latency_us * 1e-6, node_bytes_per_s=args.learner_node_gbs * 1e9)
    jobs = [("the job", Workload(work.floats, work.batch_steps, work.minibatches, work.fragment_steps)),
            ("a large job", Workload(*ints(args.large)))]
    for title, job in jobs:
        table(title, gpu, job, args.nodes, args.gpu_share, args.nic_gbs * 1e9)
    for title, job in jobs:
        efficiency_table(title[0].upper() + title[1:], gpu, job, args.gpu_share, args.nic_gbs * 1e9, net)
    rows = (cluster_table(cluster_runs(args.config, args.overrides, args), local, remote, work, args)
            if args.check_cluster else [])
    if args.json:
        Path(args.json).write_text(json.dumps({"work": asdict(work), "local": asdict(local),
                                               "remote": asdict(remote) if remote else None, "cluster": rows},
                                              indent=1, default=str))
    return 0


def load_costs(path: Path) -> tuple[Workload, Costs, Costs | None]:
    """The workload and costs an earlier ``--json`` wrote."""
    got = json.loads(path.read_text())

    def costs(d: dict | None) -> Costs | None:
        return None if d is None else Costs(**{k: Linear(**v) if isinstance(v, dict) else v for k, v in d.items()})

    return Workload(**got["work"]), costs(got["local"]), costs(got["remote"])


def measure_costs(args) -> tuple[Workload, Costs, Costs | None]:
    from hpcrl.bench import scale_measure
    from hpcrl.config import load_config

    work, steps = scale_measure.workload(args.config, args.overrides, args.seconds)
    print(f"# per env step: actor {steps['actor_step'] * 1e3:.4f} ms, a learner's batch preparation "
          f"{steps['prepare_per_step'] * 1e6:.2f} us, an actor's trajectory write {steps['record_per_step'] * 1e6:.2f} us "
          "(the virtual-time runner's env_step, prepare_per_step, record_per_step)", flush=True)
    sizes = sorted({work.floats if s.strip() == "job" else int(s) for s in args.sizes.split(",") if s.strip()})
    # the micro-run reads the job's config for its layouts and admission policy
    with tempfile.TemporaryDirectory(prefix="hpcrl-scale-cfg-") as tmp:
        cfg_path = Path(tmp) / "config.yaml"
        cfg_path.write_text(load_config(args.config, args.overrides).to_yaml())
        print(f"# {args.config}{''.join(' -o ' + o for o in args.overrides)}: P = {work.floats:,} floats, "
              f"B = {work.batch_steps}, M = {work.minibatches}, F = {work.fragment_steps}; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        local = scale_measure.costs_from(scale_measure.transport(str(cfg_path), sizes, args.seconds, tcp=False), steps)
        remote = (scale_measure.costs_from(scale_measure.transport(str(cfg_path), sizes, args.seconds, tcp=True), steps)
                  if args.check_cluster or args.tcp else None)
    return work, local, remote


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
