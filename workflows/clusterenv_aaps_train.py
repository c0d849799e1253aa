"""One run of the ClusterEnv seed's experiment: PPO on LunarLander with worker-side inference and AAPS.

The head (rank 0) trains hpcrl's ActorCritic; the workers (the other ranks, or a local mpiexec it
starts) act with their cached copies and pull new weights only when AAPS says so
(``--kl-threshold``). Hyperparameters are the seed's (Section IV-A): lr 5e-4, 1024 steps per env per
rollout, 8 minibatches, 30 epochs, gamma 0.99, GAE lambda 0.95; the rest are CleanRL's defaults.
Per-worker syncs, KL estimates and every episode go to ``--record`` (HDF5). As in the seed, PPO's loss
is unchanged: the ratio's denominator is the head's policy before the update (``--old-logprob head``);
``behaviour`` uses the acting copy's log-probabilities instead, and then PPO's clipping keeps the head
within its trust region of the stale copy, so its KL to that copy stays small and larger thresholds
never trigger a pull (measured: 0.013 nats after 10 iterations).

    mpiexec -n 3 python workflows/clusterenv_aaps_train.py --kl-threshold 0.05 --record runs/kl0.05.h5
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from hpcrl.algos.returns import generalized_advantage_estimate, next_values_from


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="LunarLander-v3", help="Gymnasium's current LunarLander (the seed ran -v2)")
    p.add_argument("--kl-threshold", type=float, default=0.05)
    p.add_argument("--record", required=True, help="HDF5 file for syncs, KL estimates and episodes")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--total-timesteps", type=int, default=81_920)
    p.add_argument("--num-steps", type=int, default=1024)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--num-minibatches", type=int, default=8)
    p.add_argument("--update-epochs", type=int, default=30)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--old-logprob", choices=("head", "behaviour"), default="head",
                   help="PPO's ratio denominator: the head's policy before the update (the seed: the loss is "
                        "unchanged and the workers' data is treated as on-policy) or the acting worker copy's")
    return p.parse_args(argv)


def main(argv=None) -> int:
    import hpcrl
    from hpcrl.clusterenv.policy import actor_critic_factory

    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    factory = actor_critic_factory((64, 64), "tanh")
    env = hpcrl.ClusterEnv(args.env_id, args.num_envs, workers=args.workers, policy=factory,
                           kl_threshold=args.kl_threshold, record=args.record)
    agent = factory(env.single_observation_space, env.single_action_space)
    opt = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    T, N = args.num_steps, args.num_envs
    obs_shape = env.single_observation_space.shape
    obs = torch.zeros((T, N, *obs_shape))
    actions = torch.zeros((T, N), dtype=torch.long)
    logprobs, rewards, final_values = (torch.zeros((T, N)) for _ in range(3))
    terminated, truncated = (torch.zeros((T, N), dtype=torch.bool) for _ in range(2))
    next_obs = torch.as_tensor(env.reset(seed=args.seed)[0])
    start, iterations = time.time(), args.total_timesteps // (T * N)
    for it in range(1, iterations + 1):
        env.publish(agent)  # AAPS: each worker decides from its KL estimate whether to pull this version
        for t in range(T):
            obs[t] = next_obs
            o, r, term, trunc, info = env.step()  # the workers act
            actions[t], logprobs[t] = torch.as_tensor(info["actions"]), torch.as_tensor(info["logprob"])
            rewards[t], terminated[t], truncated[t] = torch.as_tensor(r), torch.as_tensor(term), torch.as_tensor(trunc)
            final_values[t] = 0.0
            cut = np.flatnonzero(trunc & ~term)
            if cut.size:
                with torch.no_grad():
                    final_values[t, cut] = agent.value(np.stack(info["final_obs"][cut]))
            next_obs = torch.as_tensor(o)
        with torch.no_grad():
            values = agent.value(obs.reshape(T * N, *obs_shape)).reshape(T, N)
            nxt = next_values_from(values, agent.value(next_obs), truncated, final_values)
            adv, targets = generalized_advantage_estimate(rewards, values, nxt, terminated, truncated,
                                                          args.gamma, args.gae_lambda)
        b_obs, b_act, b_logp = obs.reshape(T * N, *obs_shape), actions.reshape(-1), logprobs.reshape(-1)
        b_adv, b_targets = adv.reshape(-1), targets.reshape(-1)
        if args.old_logprob == "head":  # PPO's trust region around the head's policy, not the stale copy's
            with torch.no_grad():
                b_logp = agent.evaluate(b_obs, b_act)[0]
        mb_size = T * N // args.num_minibatches
        for _ in range(args.update_epochs):
            order = torch.randperm(T * N)
            for lo in range(0, T * N, mb_size):
                mb = order[lo:lo + mb_size]
                logp, ent, v = agent.evaluate(b_obs[mb], b_act[mb])
                ratio = (logp - b_logp[mb]).exp()
                a = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg = torch.max(-a * ratio, -a * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                loss = pg - args.ent_coef * ent.mean() + args.vf_coef * 0.5 * ((v - b_targets[mb]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                opt.step()
        print(f"iteration {it}/{iterations}  env steps {it * T * N}  syncs per worker {env.syncs.tolist()}  "
              f"kl {np.round(env.kl, 4).tolist()}  {time.time() - start:.0f} s", flush=True)
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
