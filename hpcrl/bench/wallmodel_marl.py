"""Wall-model MARL: parameter-shared independent PPO on TurbulentChannelWM vs the log-law wall model.

All agents of the channel (both walls) act with one shared policy on their own observations and
rewards (independent learners with shared weights, as in Bae & Koumoutsakos 2022); the loop is
single-process: collect whole episodes, GAE (hpcrl.algos.returns via ppo.prepare_batch), PPO
minibatch updates (hpcrl.algos.ppo.compute_gradient) with Adam. Then the same evaluation episodes
(same stored fields, same initial wall-stress perturbation) are run with the trained policy
(deterministic), with the equilibrium log-law model and with "do nothing" (factor 1), and the
wall-stress errors against tau_ref = 1 are printed:

- mean error  = |<tau_w> - tau_ref| / tau_ref, <.> over both walls, averaged over the actions;
- local error = <|tau_w - tau_ref|> / tau_ref over every wall point, averaged over the actions.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from hpcrl.algos import ppo
from hpcrl.config import ModelConfig, PPOConfig
from hpcrl.envs.turbulence.env import TurbulentChannelEnv
from hpcrl.models import ActorCritic


def to_factor(raw: np.ndarray, low: float, high: float) -> np.ndarray:
    """Policy output in [-1, 1] (clipped) -> a wall-stress factor in [low, high]."""
    return low + (high - low) * (np.clip(raw, -1.0, 1.0) + 1.0) / 2.0


def collect_episode(env: TurbulentChannelEnv, policy: ActorCritic, rng: np.random.Generator) -> dict:
    """One episode of every agent as a time-major fragment for ppo.prepare_batch."""
    obs_d, _ = env.reset(seed=int(rng.integers(2**31)))
    agents = list(env.agents)
    keys = ("obs", "actions", "rewards", "terminated", "truncated", "behaviour_logp", "values", "final_values")
    frag = {k: [] for k in keys}
    obs = np.stack([obs_d[a] for a in agents])
    while env.agents:
        a, logp, v = policy.act(obs)
        act = to_factor(a.numpy()[:, 0], env.action_low, env.action_high)
        nobs_d, rew, term, trunc, _ = env.step({ag: np.array([act[j]], np.float32) for j, ag in enumerate(agents)})
        nobs = np.stack([nobs_d[ag] for ag in agents])
        done_t = np.array([term[ag] for ag in agents], np.float32)
        done_tr = np.array([trunc[ag] for ag in agents], np.float32)
        final = policy.value(nobs).detach().numpy() * done_tr
        for k, x in zip(keys, (obs, a.numpy(), np.array([rew[ag] for ag in agents], np.float32), done_t, done_tr,
                               logp.numpy(), v.numpy(), final)):
            frag[k].append(x)
        obs = nobs
    out = {k: np.stack(v) for k, v in frag.items()}
    out["last_value"] = policy.value(obs).detach().numpy()
    return out


def evaluate(env: TurbulentChannelEnv, act, options: list[dict]) -> dict[str, float]:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hpcrl bench wallmodel-marl", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", choices=["tiny", "small", "paper"])
    ap.add_argument("--iterations", type=int, default=80, help="PPO rounds")
    ap.add_argument("--episodes-per-iteration", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=4)
    ap.add_argument("--global-share", type=float, default=0.0, help="env global_reward_share")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--gamma", type=float, default=0.8, help="discount (and GAE lambda)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--save", default=None, help="write the trained policy's state_dict here")
    ap.add_argument("--load", default=None, help="evaluate this saved policy (with --iterations 0)")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    make = lambda **kw: TurbulentChannelEnv(args.preset, cache_dir=args.cache_dir,  # noqa: E731
                                            global_reward_share=args.global_share, **kw)
    env = make()
    agent = env.possible_agents[0]
    policy = ActorCritic(env.observation_space(agent), env.action_space(agent), ModelConfig(hidden_sizes=[32, 32]))
    policy.log_std.data.fill_(-1.0)
    cfg = PPOConfig(lr=args.lr, gamma=args.gamma, gae_lambda=args.gamma, clip=0.2, entropy_coeff=0.0,
                    minibatch_size=256, num_sgd_iter=6)
    if args.load:
        policy.load_state_dict(torch.load(args.load))
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(args.seed)

    eval_opts = [{"snapshot": i, "tau_factor": f} for i, f in zip(range(args.eval_episodes), [1.2, 0.85, 1.15, 0.8, 1.1, 0.9])]
    t0 = time.perf_counter()
    print(f"preset {args.preset}: {len(env.possible_agents)} agents, {env.preset.max_actions} actions/episode, "
          f"{env.preset.steps_per_action} solver steps/action")
    print(f"{'iter':>4} {'return':>8} {'tau_err(end)':>12} {'std':>6} {'s':>7}")
    for it in range(args.iterations):
        frags = [collect_episode(env, policy, rng) for _ in range(args.episodes_per_iteration)]
        ret = np.mean([f["rewards"].sum(0).mean() for f in frags])
        end_err = env.metrics()["local_error"]
        batch = ppo.prepare_batch(frags, cfg)
        for _ in range(cfg.num_sgd_iter):
            for mb in ppo.minibatches(batch, cfg.minibatch_size, gen):
                opt.zero_grad()
                ppo.compute_gradient(mb, policy, cfg)
                opt.step()
        print(f"{it:4d} {ret:8.4f} {end_err:12.4f} {policy.log_std.exp().item():6.3f} {time.perf_counter() - t0:7.1f}",
              flush=True)

    if args.save:
        torch.save(policy.state_dict(), args.save)

    def trained(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mean = policy.pi(torch.as_tensor(obs, dtype=torch.float32)).numpy()[:, 0]
        return to_factor(mean, env.action_low, env.action_high)

    rows = [("log-law wall model (baseline)", evaluate(make(wall_model="log_law"), lambda o: np.ones(len(o)), eval_opts)),
            ("no action (factor 1)", evaluate(env, lambda o: np.ones(len(o)), eval_opts)),
            ("trained agents (PPO, shared)", evaluate(env, trained, eval_opts))]
    base = rows[0][1]
    print(f"\nevaluation: {len(eval_opts)} episodes, same fields and initial perturbations (tau_factor "
          f"{[o['tau_factor'] for o in eval_opts]}), tau_ref = 1; errors averaged over all actions | over the "
          f"second half of each episode")
    print(f"{'wall model':32s} {'mean err':>9s} {'local err':>10s} | {'mean err':>9s} {'local err':>10s} | "
          f"{'ratios to log law (4 columns)':>30s}")
    keys = ("mean_error", "local_error", "mean_error_late", "local_error_late")
    for name, r in rows:
        ratios = " ".join(f"{r[k] / base[k]:6.2f}" for k in keys)
        print(f"{name:32s} {r[keys[0]]:9.4f} {r[keys[1]]:10.4f} | {r[keys[2]]:9.4f} {r[keys[3]]:10.4f} | {ratios:>30s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
