"""Wall-model MARL: PPO agents trained by `hpcrl run` on TurbulentChannelWM vs the log-law wall model.

Training is `hpcrl run CONFIG` itself (default ``hpcrl/configs/wallmodel_tiny.yaml``: actor ranks
step channel copies whose agents are the instances of one parameter-shared policy, independent
rewards, as Bae & Koumoutsakos 2022), under the serial runner or, with ``--runner mpi``, MPI
ranks. The trained weights are read from the run's checkpoint into the model the algorithm
builds; then the same evaluation episodes (same stored fields, same initial wall-stress
perturbation) are run with the trained policy (deterministic: the Gaussian mean, mapped onto
the action space as the actors map samples), with the equilibrium log-law model and with "do
nothing" (factor 1), and the wall-stress errors against tau_ref = 1 are printed:

- mean error  = |<tau_w> - tau_ref| / tau_ref, <.> over both walls, averaged over the actions;
- local error = <|tau_w - tau_ref|> / tau_ref over every wall point, averaged over the actions.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from hpcrl.config import load_config
from hpcrl.envs import make

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "wallmodel_tiny.yaml"
EVAL_FACTORS = [1.2, 0.85, 1.15, 0.8, 1.1, 0.9]


def evaluate(env, act, options: list[dict]) -> dict[str, float]:
    """Errors averaged over all actions of the given episodes, and over their second halves
    (after the recovery from the initial perturbation); ``act(obs [N, 2]) -> factors [N]``."""
    rows = []
    for opt in options:
        obs_d, _ = env.reset(options=opt)
        agents = list(env.agents)
        n = 0
        while env.agents:
            f = act(np.stack([obs_d[a] for a in agents]))
            obs_d, *_ = env.step({a: np.array([f[j]], np.float32) for j, a in enumerate(agents)})
            m = env.metrics()
            rows.append((m["mean_error"], m["local_error"], n >= env.preset.max_actions // 2))
            n += 1
    r = np.array(rows)
    late = r[r[:, 2] > 0]
    return {"mean_error": float(r[:, 0].mean()), "local_error": float(r[:, 1].mean()),
            "mean_error_late": float(late[:, 0].mean()), "local_error_late": float(late[:, 1].mean())}


def train(config: str, runner: str, overrides: list[str], run_dir: Path) -> None:
    """`hpcrl run CONFIG --runner RUNNER -o io.run_dir=RUN_DIR -o ...` in this process (mpi: it starts mpiexec)."""
    from hpcrl.cli import main as cli_main

    args = ["run", config, "--runner", runner, "-o", f"io.run_dir={run_dir}"]
    for o in overrides:
        args += ["-o", o]
    rc = cli_main(args)
    if rc != 0:
        raise SystemExit(f"hpcrl bench wallmodel-marl: training failed (hpcrl run exit code {rc})")


def trained_policy(cfg, run_dir: Path):
    """``act(obs) -> factors`` of the policy in RUN_DIR's checkpoint: mean action, mapped as the actors map samples.

    The obs rows are one channel's agents in order, so a MARL model (ippo, mappo) routes each to its
    agent's policy."""
    from hpcrl.algos import make_algorithm
    from hpcrl.runtime.record.checkpoint import load_checkpoint
    from hpcrl.runtime.roles.sampler import describe_env, rescale

    state = load_checkpoint(run_dir)
    if state is None:
        raise SystemExit(f"hpcrl bench wallmodel-marl: {run_dir} has no checkpoint")
    info = describe_env(cfg.env)
    model = make_algorithm(cfg.algo, cfg.model, cfg.aggregation).make_model(info.observation_space, info.action_space)
    model.flat.load_(np.asarray(state["params"], dtype=np.float32))
    low, high = info.action_space.low, info.action_space.high

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mean = model.greedy(torch.as_tensor(obs, dtype=torch.float32)).numpy().reshape(len(obs), -1)
        mapped = rescale(mean, low, high) if cfg.env.rescale_actions else np.clip(mean, low, high)
        return mapped[:, 0]

    return act, int(state.get("version", -1))


def training_curve(run_dir: Path, parts: int = 5) -> str:
    """Mean agent return per fifth of the training episodes (from run.h5)."""
    from hpcrl.io import read_table

    ret = read_table(run_dir / "run.h5", "episodes")["return"]
    chunks = np.array_split(ret, parts)
    return " ".join(f"{c.mean():.4f}" for c in chunks if len(c)) + f" ({len(ret)} agent episodes)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hpcrl bench wallmodel-marl", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="the hpcrl run config that trains the agents")
    ap.add_argument("--runner", choices=("serial", "mpi"), default="serial")
    ap.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for training and evaluation, e.g. -o env.kwargs.preset=small")
    ap.add_argument("--run-dir", default=None, help="where the training run goes (default runs/wallmodel-marl-TIME)")
    ap.add_argument("--load", default=None, metavar="RUN_DIR", help="evaluate this finished run instead of training")
    ap.add_argument("--eval-episodes", type=int, default=4, choices=range(1, len(EVAL_FACTORS) + 1))
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    if args.load:
        run_dir = Path(args.load).resolve()
        cfg = load_config(run_dir / "config.yaml", args.overrides)
    else:
        run_dir = Path(args.run_dir or f"runs/wallmodel-marl-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
        train(args.config, args.runner, args.overrides, run_dir)
        cfg = load_config(run_dir / "config.yaml")
    t_train = time.perf_counter() - t0
    act, version = trained_policy(cfg, run_dir)
    kwargs = dict(cfg.env.kwargs)
    env = make(cfg.env.id, **kwargs)
    eval_opts = [{"snapshot": i, "tau_factor": f} for i, f in zip(range(args.eval_episodes), EVAL_FACTORS)]
    rows = [("log-law wall model (baseline)",
             evaluate(make(cfg.env.id, **{**kwargs, "wall_model": "log_law"}), lambda o: np.ones(len(o)), eval_opts)),
            ("no action (factor 1)", evaluate(env, lambda o: np.ones(len(o)), eval_opts)),
            (f"trained agents ({cfg.algo.name}, {getattr(cfg.algo, 'policies', 'shared')})",
             evaluate(env, act, eval_opts))]
    print(f"\ntraining: {run_dir} ({args.runner if not args.load else 'loaded'}, {t_train:.0f} s), policy version "
          f"{version}; mean agent return per fifth of training: {training_curve(run_dir)}")
    print(f"preset {env.preset.name}: {len(env.possible_agents)} agents, {env.preset.max_actions} actions/episode")
    base = rows[0][1]
    print(f"evaluation: {len(eval_opts)} episodes, same fields and initial perturbations (tau_factor "
          f"{[o['tau_factor'] for o in eval_opts]}), tau_ref = 1; errors averaged over all actions | over the "
          f"second half of each episode")
    print(f"{'wall model':32s} {'mean err':>9s} {'local err':>10s} | {'mean err':>9s} {'local err':>10s} | "
          f"{'ratios to log law (4 columns)':>30s}")
    keys = ("mean_error", "local_error", "mean_error_late", "local_error_late")
    for name, r in rows:
        ratios = " ".join(f"{r[k] / base[k]:6.2f}" for k in keys)
        print(f"{name:32s} {r[keys[0]]:9.4f} {r[keys[1]]:10.4f} | {r[keys[2]]:9.4f} {r[keys[3]]:10.4f} | {ratios:>30s}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
