"""The one fact a MARL config repeats from its env: the number of agents per env copy."""
from __future__ import annotations

from hpcrl.errors import ConfigError


def check_agent_count(cfg, env_info) -> None:
    """ConfigError unless ``algo.agents`` equals the env's agents per copy (instances / env.num_envs).

    ``env_info``: :func:`hpcrl.runtime.roles.sampler.describe_env`'s answer for ``cfg.env``."""
    agents = getattr(cfg.algo, "agents", None)
    if agents is None:
        return
    per_copy = env_info.num_envs // cfg.env.num_envs
    if per_copy != agents:
        raise ConfigError(f"algo.agents: {agents}, but {cfg.env.id} has {per_copy} agents per env copy; "
                          f"set algo.agents: {per_copy}")
