"""One learner's minibatch gradient on CPU and CUDA (eager, and replayed from a CUDA graph), per model and size.

What a learner does per gradient, in one process with no MPI: load the newest weights into the
model (a host array, as the weight board gives them), compute the PPO gradient of one minibatch
and bring the flat gradient back to the host (the mailbox push reads a host array). The model
and the minibatch are those of a shipped config (CartPole's or Hopper's network, random data of
the right shapes); the minibatch already sits on the learner's device, as the learner keeps its
batch there. Times are medians over ``--seconds`` per case; the table gives each case's time and
its speed against the CPU with one torch thread (how every rank runs), measured in this process.

A second table times a group's whole minibatch step under ``learners.push: update`` (gradient,
clipping and the Adam update, the weights staying on the device): eager, and on CUDA replayed from
one graph (``runtime/roles/cuda_graph_step.py``).

    hpcrl bench learner-step [--configs cartpole,hopper] [--sizes 64,256,1024] [--seconds 1.0]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def random_minibatch(info, size: int, seed: int = 0) -> dict:
    """A PPO minibatch of ``size`` rows with random observations, actions, log-probs, values and advantages for
    ``info``'s spaces (what a gradient costs does not depend on the numbers)."""
    g = torch.Generator().manual_seed(seed)
    space = info.action_space
    actions = (torch.randint(0, space.n, (size,), generator=g) if hasattr(space, "n")
               else torch.randn(size, *space.shape, generator=g))
    return {"obs": torch.randn(size, *info.observation_space.shape, generator=g), "actions": actions,
            "behaviour_logp": torch.randn(size, generator=g) * 0.1 - 1.0, "values": torch.randn(size, generator=g),
            "advantages": torch.randn(size, generator=g), "returns": torch.randn(size, generator=g)}


def make_case(config: str, size: int, device: str):
    """(algo, model, minibatch on ``device``, host weights) for one config's network (weights seeded alike
    on every device, so the gradients can be compared)."""
    from hpcrl.algos import make_algorithm
    from hpcrl.config import load_config
    from hpcrl.runtime.roles.sampler import describe_env

    cfg = load_config(CONFIGS / f"{config}.yaml")
    info = describe_env(cfg.env)
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    torch.manual_seed(0)
    weights = algo.make_model(info.observation_space, info.action_space).flat.params.detach().numpy().copy()
    model = algo.make_model(info.observation_space, info.action_space, torch.device(device))
    mb = {k: v.to(device) for k, v in random_minibatch(info, size).items()}
    return algo, model, mb, weights


def time_case(step, seconds: float) -> float:
    """Median seconds of ``step()`` over about ``seconds`` (after 5 warm-up calls)."""
    for _ in range(5):
        step()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 20:
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(config: str, size: int, mode: str, seconds: float) -> tuple[float, np.ndarray]:
    """Median seconds per gradient in ``mode`` (cpu, cuda, cuda-graph) and the last gradient."""
    from hpcrl.runtime.roles.cuda_graph import GraphedGradient

    device = "cpu" if mode == "cpu" else "cuda"
    algo, model, mb, weights = make_case(config, size, device)
    out = {}
    if mode == "cuda-graph":
        graphed = GraphedGradient(algo, model)

        def step():
            model.flat.load_(weights)
            out["grad"], _ = graphed(mb)
    else:
        def step():
            model.flat.load_(weights)
            grad, stats = algo.compute_gradient(mb, model)
            out["grad"] = grad.detach().cpu().numpy()
    seconds_per = time_case(step, seconds)
    return seconds_per, out["grad"].copy()


def measure_step(config: str, size: int, mode: str, seconds: float) -> float:
    """Median seconds per whole minibatch step (gradient, clipping, Adam) in ``mode`` (cpu, cuda, cuda-graph)."""
    from hpcrl.runtime.roles.group_update import GroupUpdate

    device = "cpu" if mode == "cpu" else "cuda"
    algo, model, mb, _ = make_case(config, size, device)
    inner = GroupUpdate(algo, model, torch.Generator(), cuda_graphs=mode == "cuda-graph")
    inner.set_lr(1e-5)  # the weights barely move over the thousands of timed steps

    def step():
        inner.fused_step(mb)
        if device == "cuda":
            torch.cuda.synchronize()  # eager steps end with a stats read; a replay's end is waited for here

    return time_case(step, seconds)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench learner-step", description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="cartpole,hopper", help="shipped configs whose network to use")
    p.add_argument("--sizes", default="64,256,1024", help="minibatch rows (comma-separated)")
    p.add_argument("--seconds", type=float, default=1.0, help="timing per case (default 1.0)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # as every rank runs
    modes = ["cpu"] + (["cuda", "cuda-graph"] if torch.cuda.is_available() else [])
    if len(modes) == 1:
        print("no CUDA device: CPU only")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread"
          + (f", {torch.cuda.get_device_name()}" if len(modes) > 1 else ""))
    head = (f"{'config':>8} {'rows':>5} " + " ".join(f"{m + ' ms':>14}" for m in modes)
            + " " + " ".join(f"{m + ' speed-up':>20}" for m in modes[1:]))
    cases = [(config.strip(), int(size)) for config in args.configs.split(",") if config.strip()
             for size in args.sizes.split(",") if size.strip()]
    print(head + "  max |grad - cpu grad|")
    for config, size in cases:
        got = {m: measure(config, size, m, args.seconds) for m in modes}
        cpu_s, cpu_grad = got["cpu"]
        diff = max((float(np.abs(g - cpu_grad).max()) for m, (_, g) in got.items() if m != "cpu"), default=0.0)
        print(f"{config:>8} {size:>5} " + " ".join(f"{1e3 * got[m][0]:>14.3f}" for m in modes) + " "
              + " ".join(f"{cpu_s / got[m][0]:>19.2f}x" for m in modes[1:]) + f"  {diff:.2e}")
    print("\nwhole minibatch step (learners.push=update: gradient, clipping, Adam)")
    print(head)
    for config, size in cases:
        took = {m: measure_step(config, size, m, args.seconds) for m in modes}
        print(f"{config:>8} {size:>5} " + " ".join(f"{1e3 * took[m]:>14.3f}" for m in modes) + " "
              + " ".join(f"{took['cpu'] / took[m]:>19.2f}x" for m in modes[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
