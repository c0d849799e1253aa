"""A run directory's policy, rebuilt as the roles build it, with a checkpoint's weights and statistics.

:func:`load_policy` reads ``RUN_DIR/config.yaml`` (the resolved config the run was started with),
builds the algorithm and model as every role does (``make_algorithm``, then ``algo.make_model`` on the
spaces :func:`describe_env` reads from one env), copies the checkpoint's flat parameter buffer into
the model, and keeps a one-env :class:`VectorSampler` of the run's env for the two things the actors
do around the policy: observation normalisation (``env.normalize_obs``, with an actor's running
statistics from the checkpoint, actor 0's unless it has none) and the action mapping (Box actions
clipped into the space, or rescaled onto it with ``env.rescale_actions``). :meth:`RunPolicy.actions`
is therefore exactly what an actor's evaluation episode steps the env with.

A checkpoint is our own ``torch.save`` file (RNG states, optimizer dicts): it is unpickled in full,
as ``--resume`` does, so load only checkpoints you trust.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from hpcrl.errors import ConfigError

CONFIG_FILE = "config.yaml"


@dataclass
class RunPolicy:
    """A run's model with checkpoint weights, and the actors' observation and action mapping around it."""

    run_dir: Path
    cfg: Any
    """The run's RunConfig (from its config.yaml)."""
    algo: Any
    model: nn.Module
    env: Any
    """EnvInfo: one instance's observation and action space."""
    kind: str
    """'gym', 'batched' or 'parallel' (hpcrl.runtime.roles.env_backends.env_kind)."""
    sampler: Any
    """A one-env VectorSampler (its env closed): policy_obs() and env_action() as the actors apply them."""
    checkpoint: str
    """Which checkpoint: the file named on the command line, or RUN_DIR/checkpoints (the newest intact one)."""
    state: dict
    """The checkpoint (``version``, ``env_steps``, ...)."""
    normalizer_actor: int | None
    """Whose observation statistics the policy sees (None: env.normalize_obs is off)."""
    agents: list[str] | None = None
    """A parallel env's agent names in instance order (None for the other kinds)."""

    @property
    def version(self) -> int:
        return int(self.state.get("version", -1))

    def actions(self, raw_obs: np.ndarray, sampled: bool = False) -> np.ndarray:
        """Env actions for raw observations [B, ...]: the greedy policy (as evaluation episodes act) or a
        sample (as training acts), through the run's normalisation and action mapping. A parallel env's
        rows come in whole env copies (row r is agent r mod A), as the actors step them."""
        obs = self.sampler.policy_obs(raw_obs)
        a = self.algo.act(self.model, obs)[0] if sampled else self.algo.greedy(self.model, obs)
        return self.sampler.env_action(a.cpu().numpy())

    def policy_of(self) -> list[int] | None:
        """A multi-policy (MARL) model's agent -> policy map in the checkpoint (None for one policy)."""
        mapping = getattr(self.model, "mapping", None)
        return None if mapping is None else [int(p) for p in mapping().tolist()]


def read_run_config(run_dir: str | Path):
    """The RunConfig of a run directory; ConfigError (one line) when it is not one."""
    from hpcrl.config import load_config

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no {CONFIG_FILE}; `hpcrl run` writes one)")
    return load_config(run_dir / CONFIG_FILE)


def read_checkpoint(run_dir: Path, cfg, path: str | Path | None = None) -> tuple[dict, str]:
    """(checkpoint state, where from): the file ``path``, else the run's newest intact checkpoint."""
    import torch

    from hpcrl.runtime.record.checkpoint import CHECKPOINT_DIR, FORMAT, load_checkpoint

    if path is None:
        state = load_checkpoint(run_dir)
        if state is None:
            fused = (f" (algo {cfg.algo.name} in the fused single-process loop writes none)"
                     if getattr(cfg.algo, "fused_loop", False) else "")
            raise ConfigError(f"{run_dir}: no checkpoint in {run_dir / CHECKPOINT_DIR}{fused}")
        where = str(run_dir / CHECKPOINT_DIR)
    else:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"--checkpoint {path}: no such file")
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - any failure to unpickle: not a checkpoint we can use
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"--checkpoint {path}: not a readable checkpoint ({text})") from None
        where = str(path)
    if not isinstance(state, dict) or state.get("format") != FORMAT or "params" not in state:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ConfigError(f"{where}: not an hpcrl checkpoint of format {FORMAT} (format {found!r})")
    return state, where


def load_policy(run_dir: str | Path, checkpoint: str | Path | None = None) -> RunPolicy:
    """The run's policy on the CPU with the checkpoint's weights (the newest, or the file ``checkpoint``)."""
    import torch

    from hpcrl.algos import make_algorithm
    from hpcrl.runtime.roles.env_backends import env_kind
    from hpcrl.runtime.roles.sampler import VectorSampler, describe_env

    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    state, where = read_checkpoint(run_dir, cfg, checkpoint)
    env = describe_env(cfg.env)
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    model = algo.make_model(env.observation_space, env.action_space, device=torch.device("cpu"))
    try:
        model.flat.load_(state["params"])
    except ValueError as exc:
        raise ConfigError(f"{where}: its parameters do not fit the model of {run_dir / CONFIG_FILE} ({exc}); "
                          "was the config changed after the run?") from None
    model.eval().requires_grad_(False)  # inference only (an exported module's outputs need no grad either)
    sampler = VectorSampler(cfg.env.model_copy(update={"num_envs": 1}), actor_index=0)
    sampler.close()  # only its normalisation and action mapping are used
    actor = _load_normalizer(sampler, cfg, state.get("normalizers") or [], where)
    kind = env_kind(cfg.env.id)
    return RunPolicy(run_dir, cfg, algo, model, env, kind, sampler, where, state, actor,
                     agent_names(cfg.env) if kind == "parallel" else None)


def agent_names(env_cfg) -> list[str]:
    """A parallel env's possible agents, the order of its instances (instance k * A + j is agent j of copy k)."""
    from hpcrl.envs import make

    env = make(env_cfg.id, **env_cfg.kwargs)
    try:
        return [str(a) for a in env.possible_agents]
    finally:
        env.close()


def _load_normalizer(sampler, cfg, normalizers: list, where: str) -> int | None:
    """Actor 0's observation statistics into ``sampler`` (the first actor that has some when actor 0 has
    none); the actor used, None without env.normalize_obs; ConfigError when the checkpoint has none."""
    if not cfg.env.normalize_obs:
        return None
    for actor, saved in enumerate(normalizers):
        if saved is not None and saved.get("obs") is not None:
            sampler.load_normalizer_state({"obs": saved["obs"]})
            if actor:
                print(f"hpcrl: actor 0 has no observation statistics in {where}; using actor {actor}'s",
                      file=sys.stderr)
            return actor
    raise ConfigError(f"{where}: env.normalize_obs is on but the checkpoint holds no observation statistics "
                      "(written before an actor reported any, or by an hpcrl that did not keep them)")
