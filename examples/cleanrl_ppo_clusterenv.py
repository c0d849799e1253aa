"""PPO in one file, CleanRL's layout (settings, agent, storage, rollout, GAE, update, logging), with a
switch for where the environments run: ``--env-backend gym`` (``gym.make_vec``, in this process) or
``--env-backend cluster`` (``hpcrl.ClusterEnv``: the same envs on MPI worker ranks). Nothing else differs.

    python examples/cleanrl_ppo_clusterenv.py --env-backend gym
    python examples/cleanrl_ppo_clusterenv.py --env-backend cluster --workers 2     # starts mpiexec itself
    mpiexec -n 3 python examples/cleanrl_ppo_clusterenv.py --env-backend cluster --workers 2  # rank 0 trains

It stops when the mean return of the last 20 episodes reaches ``--target-return`` (CartPole-v1: 475)
or after ``--total-timesteps``, and prints one RESULT line (steps and wall-clock seconds to the target).
Time-limit truncations are bootstrapped from ``infos["final_obs"]`` (same-step autoreset), not
treated as deaths; GAE is hpcrl's (``hpcrl.algos.returns``).
"""
from __future__ import annotations

import argparse
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from torch import nn
from torch.distributions import Categorical

from hpcrl.algos.returns import generalized_advantage_estimate, next_values_from


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--env-backend", choices=("gym", "cluster"), default="gym")
    p.add_argument("--workers", type=int, default=2, help="cluster: MPI worker ranks")
    p.add_argument("--head-threads", type=lambda v: v if v in ("auto", "none") else int(v), default="auto",
                   help="cluster: ClusterEnv's head_threads (auto, none: leave torch's, or a count)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=500_000)
    p.add_argument("--target-return", type=float, default=475.0)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=128, help="steps per env per rollout")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch.set_num_threads before anything else (default: torch's own, as CleanRL leaves it)")
    args = p.parse_args(argv)
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    return args


def make_envs(args):
    """The only place the backend matters."""
    if args.env_backend == "cluster":
        import hpcrl

        envs = hpcrl.ClusterEnv(args.env_id, args.num_envs, workers=args.workers,
                                head_threads=None if args.head_threads == "none" else args.head_threads)
    else:
        envs = gym.make_vec(args.env_id, args.num_envs, vectorization_mode="sync",
                            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def layer(n_in, n_out, std=np.sqrt(2)):
    lin = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.zeros_(lin.bias)
    return lin


class Agent(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                   layer(64, n_actions, 0.01))

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, action=None):
        dist = Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.get_value(x)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    envs = make_envs(args)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    T, N = args.num_steps, args.num_envs
    obs = torch.zeros((T, N, obs_dim))
    actions = torch.zeros((T, N), dtype=torch.long)
    logprobs, rewards, values, final_values = (torch.zeros((T, N)) for _ in range(4))
    terminated, truncated = torch.zeros((T, N), dtype=torch.bool), torch.zeros((T, N), dtype=torch.bool)

    start, global_step, returns = time.time(), 0, deque(maxlen=20)
    reached = None
    next_obs = torch.as_tensor(envs.reset(seed=args.seed)[0], dtype=torch.float32)
    num_iterations = args.total_timesteps // args.batch_size
    for iteration in range(1, num_iterations + 1):
        optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1.0) / num_iterations)
        for t in range(T):  # rollout
            global_step += N
            obs[t] = next_obs
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            actions[t], logprobs[t], values[t] = action, logprob, value
            next_obs_np, reward, term, trunc, infos = envs.step(action.numpy())
            rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
            terminated[t], truncated[t] = torch.as_tensor(term), torch.as_tensor(trunc)
            final_values[t] = 0.0
            ended = np.flatnonzero(trunc & ~term)
            if ended.size:  # bootstrap a time-limit cut from the observation it ended in
                last = torch.as_tensor(np.stack(infos["final_obs"][ended]), dtype=torch.float32)
                with torch.no_grad():
                    final_values[t, ended] = agent.get_value(last)
            if "episode" in infos:
                returns.extend(infos["episode"]["r"][infos["_episode"]].tolist())
            next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
        if len(returns) == returns.maxlen and np.mean(returns) >= args.target_return and reached is None:
            reached = (global_step, time.time() - start)
            break

        with torch.no_grad():  # GAE, truncation bootstrapped (hpcrl.algos.returns)
            nxt = next_values_from(values, agent.get_value(next_obs), truncated, final_values)
            advantages, targets = generalized_advantage_estimate(rewards, values, nxt, terminated, truncated,
                                                                 args.gamma, args.gae_lambda)
        b_obs, b_actions, b_logprobs = obs.reshape(-1, obs_dim), actions.reshape(-1), logprobs.reshape(-1)
        b_adv, b_targets, b_values = advantages.reshape(-1), targets.reshape(-1), values.reshape(-1)

        for _ in range(args.update_epochs):  # update
            order = torch.randperm(args.batch_size)
            for lo in range(0, args.batch_size, args.minibatch_size):
                mb = order[lo:lo + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                v_loss = 0.5 * ((newvalue - b_targets[mb]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        mean = float(np.mean(returns)) if returns else float("nan")  # logging
        print(f"step {global_step:7d}  mean return (last 20) {mean:6.1f}  {global_step / (time.time() - start):6.0f} steps/s",
              flush=True)
    envs.close()
    steps, seconds = reached or (global_step, time.time() - start)
    print(f"RESULT backend={args.env_backend} env={args.env_id} reached={reached is not None} "
          f"steps={steps} seconds={seconds:.1f} mean_return={np.mean(returns) if returns else float('nan'):.1f}",
          flush=True)
    return 0 if reached else 1


if __name__ == "__main__":
    raise SystemExit(main())
