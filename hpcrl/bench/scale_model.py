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
                            [--nodes 1,2,4,...,1000] [--gpu-share 0.5] [--gpu-gradient-ms 0.43] [--nic-gbs 25]
                            [--check-cluster [--cluster-nodes 1,2,3] [--actors-per-node 2] [--steps 30000]
                             [--push gradient,update]] [--json FILE]
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

from hpcrl.bench.scale_predict import (FETCH_MODES, PUSH_MODES, Costs, Layout, Workload, blend, fmt_rate, perlmutter,
                                       predict, saturation_nodes)

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
            print(f"  {name:15s} {at(P):9.4f} {at(1 << 20):9.3f}   = {1e3 * value['fixed']:.4f} ms + "
                  f"{1e9 * value['per_float']:.3f} ns/float ({4e-9 / value['per_float'] if value['per_float'] else float('inf'):.2f} GB/s)")
        else:
            print(f"  {name:15s} {1e3 * value:9.4f}")


def table(costs: Costs, work: Workload, nodes: list[int], gpu_share: float, nic: float) -> None:
    print(f"\nPerlmutter-like layout: {gpu_share:.0%} GPU nodes (4 learner ranks each, rank 0 on the first), the rest "
          f"CPU nodes of 64 actors; rank 0's link {nic / 1e9:.0f} GB/s. Env steps/s, pushes/s, rank 0 busy share, "
          f"rank 0's outgoing weight bytes/s, and the bottleneck, per push mode x fetch mode:")
    modes = [(p, f) for p in PUSH_MODES for f in FETCH_MODES]
    print(f"{'nodes':>5} {'actors':>6} {'lrn':>4} | " + " | ".join(f"{p + '/' + f:^39}" for p, f in modes))
    for n in nodes:
        lay = perlmutter(n, gpu_share, nic_bytes_per_s=nic)
        cells = []
        for p, f in modes:
            r = predict(costs, work, lay, p, f)
            cells.append(f"{fmt_rate(r.env_steps_per_s):>6} {fmt_rate(r.pushes_per_s):>6} {min(r.rank0_busy, 9.99):>4.2f} "
                         f"{fmt_rate(r.rank0_out_bytes_per_s) + 'B':>7} {r.bottleneck[:11]:>11}")
        print(f"{n:>5} {lay.actors:>6} {lay.learners:>4} | " + " | ".join(cells))
    print("\nwhere the single parameter rank becomes the bottleneck (fewest nodes; rank 0 CPU or its link), and "
          "the env steps/s it then allows:")
    for p, f in modes:
        at = saturation_nodes(costs, work, p, f, lambda n: perlmutter(n, gpu_share, nic_bytes_per_s=nic))
        if at is None:
            print(f"  {p:8s} push, per-{f} fetch: not below 1,000,000 nodes")
            continue
        r = predict(costs, work, perlmutter(at, gpu_share, nic_bytes_per_s=nic), p, f)
        print(f"  {p:8s} push, per-{f} fetch: {at:>6,} nodes ({r.bottleneck}), {fmt_rate(r.env_steps_per_s)} env steps/s, "
              f"{fmt_rate(r.pushes_per_s)} pushes/s, {fmt_rate(r.rank0_out_bytes_per_s)}B/s of weights out")


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


def cluster_check(config: str, overrides: list[str], local: Costs, remote: Costs, work: Workload, args) -> list[dict]:
    from hpcrl.bench.update_push import measure

    out = Path(args.cluster_dir or tempfile.mkdtemp(prefix="hpcrl-scale-cluster-", dir=Path.cwd()))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for push in args.push:
        for n in args.cluster_nodes:
            actors = args.actors_per_node * n
            run_dir = out / f"{push}-n{n}"
            print(f"local cluster: {n} node(s), {actors} actors, push {push}, {args.steps} env steps ...",
                  file=sys.stderr, flush=True)
            load_before = os.getloadavg()[0]
            job = submit(config, n, actors, args.steps, push, run_dir, overrides)
            state = wait_job(job, args.job_timeout)
            if state != "COMPLETED":
                rows.append({"push": push, "nodes": n, "job": job, "state": state})
                print(f"  job {job}: {state}", file=sys.stderr, flush=True)
                continue
            got, where = measure(run_dir), placement(run_dir / "run.h5")
            lay = Layout(nodes=n, actors=actors, actor_nodes=where["actor_nodes"], learners=1, cores=args.cores)
            pred = predict(blend(local, remote, where["remote_share"]), work, lay, push, "actor")
            rows.append({"push": push, "nodes": n, "job": job, "state": state, "where": where, "measured": got,
                         "predicted": {**asdict(pred)}, "load": (load_before, os.getloadavg()[0])})
    print(f"\nlocal cluster (scripts/local_cluster.sh; every node a namespace on this machine's {os.cpu_count()} cores, "
          f"the model given {args.cores} cores), {args.actors_per_node} actors per node, 1 learner, {args.steps} env "
          f"steps per job; measured from each run's run.h5 (rounds, gradients, parameter_load):")
    print(f"{'push':8} {'nodes':>5} {'actors':>6} {'remote':>6} | {'env steps/s':>17} {'pushes/s':>15} "
          f"{'rank0 busy':>11} | {'bottleneck':>10} {'meas/pred':>9} {'load':>9}")
    for r in rows:
        if r["state"] != "COMPLETED":
            print(f"{r['push']:8} {r['nodes']:>5} job {r['job']} {r['state']}")
            continue
        m, p = r["measured"], r["predicted"]
        print(f"{r['push']:8} {r['nodes']:>5} {args.actors_per_node * r['nodes']:>6} {r['where']['remote_share']:>6.0%} | "
              f"{m['steps_per_s']:>7,.0f} / {p['env_steps_per_s']:>7,.0f} {m['pushes_per_s']:>6.0f} / {p['pushes_per_s']:>6.0f} "
              f"{m['rank0_busy_share']:>5.2f}/{p['rank0_busy']:>4.2f} | {p['bottleneck']:>10} "
              f"{m['steps_per_s'] / p['env_steps_per_s']:>9.2f} {r['load'][0]:>4.1f}-{r['load'][1]:<4.1f}")
    print("(measured / predicted in each pair; remote: the actors on another node than rank 0 and the learner; "
          "load: this machine's load average before and after the job)")
    print(f"run directories: {out}")
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
    p.add_argument("--nic-gbs", type=float, default=25.0, help="rank 0's link in GB/s (Slingshot-11: 25)")
    p.add_argument("--check-cluster", action="store_true", help="also run the job on 1, 2, 3 local cluster nodes")
    p.add_argument("--cluster-nodes", type=ints, default=[1, 2, 3])
    p.add_argument("--actors-per-node", type=int, default=2)
    p.add_argument("--steps", type=int, default=30_000, help="env steps per cluster job")
    p.add_argument("--push", type=lambda s: [x for x in s.split(",") if x], default=list(PUSH_MODES))
    p.add_argument("--cores", type=float, default=float(os.cpu_count() or 1), help="cores the cluster's ranks share")
    p.add_argument("--job-timeout", type=float, default=600.0)
    p.add_argument("--cluster-dir", help="keep the cluster runs here (default: a new folder under the current one)")
    p.add_argument("--json", help="write the costs, tables' inputs and cluster rows here")
    args = p.parse_args(argv)
    if any(m not in PUSH_MODES for m in args.push):
        p.error(f"--push: allowed {', '.join(PUSH_MODES)}")
    from hpcrl.bench import scale_measure

    work, steps = scale_measure.workload(args.config, args.overrides, args.seconds)
    sizes = sorted({work.floats if s.strip() == "job" else int(s) for s in args.sizes.split(",") if s.strip()})
    # the micro-run reads the job's config for its layouts and admission policy
    with tempfile.TemporaryDirectory(prefix="hpcrl-scale-cfg-") as tmp:
        from hpcrl.config import load_config

        cfg_path = Path(tmp) / "config.yaml"
        cfg_path.write_text(load_config(args.config, args.overrides).to_yaml())
        print(f"# {args.config}{''.join(' -o ' + o for o in args.overrides)}: P = {work.floats:,} floats, "
              f"B = {work.batch_steps}, M = {work.minibatches}, F = {work.fragment_steps}; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        local = scale_measure.costs_from(scale_measure.transport(str(cfg_path), sizes, args.seconds, tcp=False), steps)
        remote = (scale_measure.costs_from(scale_measure.transport(str(cfg_path), sizes, args.seconds, tcp=True), steps)
                  if args.check_cluster else None)
    print_costs("costs on this machine, ranks on one node (shared memory)", local, work)
    if remote is not None:
        print_costs("costs with the ranks as on different nodes (OFI netmod over TCP, no shared memory)", remote, work)
    gpu = replace(local, gradient=args.gpu_gradient_ms * 1e-3)
    table(gpu, work, args.nodes, args.gpu_share, args.nic_gbs * 1e9)
    rows = cluster_check(args.config, args.overrides, local, remote, work, args) if args.check_cluster else []
    if args.json:
        Path(args.json).write_text(json.dumps({"work": asdict(work), "local": asdict(local),
                                               "remote": asdict(remote) if remote else None, "cluster": rows},
                                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
