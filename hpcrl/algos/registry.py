"""Every algorithm hpcrl trains, once: its name, its config class and where its algorithm object lives.

A new algorithm is its config class (an :class:`~hpcrl.config_base.AlgoSection` declaring its facts
for the runtime's Plan), its algorithm (against :mod:`hpcrl.algos.base`) and one line here. The
config tree (the ``algo`` section's choices), ``make_algorithm``, docs/config.md and the fused loop
all read this table. Importing it imports no torch: the algorithm modules are named, not imported.
"""
from __future__ import annotations

from dataclasses import dataclass

from hpcrl.algos.ha2c_config import HA2CConfig
from hpcrl.algos.hddpg_config import HDDPGConfig
from hpcrl.algos.impact_config import IMPACTConfig
from hpcrl.algos.ppo_config import PPOConfig
from hpcrl.marl.config import IPPOConfig, IQLConfig, MAPPOConfig, VDNConfig


@dataclass(frozen=True)
class Entry:
    config: type
    algorithm: str
    """``module:Class`` of the algorithm object (imported by make_algorithm only)."""
    takes_aggregation: bool = True
    """The algorithm object is built with the aggregation section (IS truncation) too."""


ALGORITHMS: dict[str, Entry] = {
    "ppo": Entry(PPOConfig, "hpcrl.algos.ppo:PPO"),
    "impact": Entry(IMPACTConfig, "hpcrl.algos.impact:IMPACT"),
    "ha2c": Entry(HA2CConfig, "hpcrl.algos.ha2c:HA2C", takes_aggregation=False),
    "hddpg": Entry(HDDPGConfig, "hpcrl.algos.hddpg:HDDPG", takes_aggregation=False),
    "ippo": Entry(IPPOConfig, "hpcrl.marl.ppo:IPPO"),
    "mappo": Entry(MAPPOConfig, "hpcrl.marl.ppo:MAPPO"),
    "iql": Entry(IQLConfig, "hpcrl.marl.dqn:IQL"),
    "vdn": Entry(VDNConfig, "hpcrl.marl.dqn:VDN"),
}
ALGO_CONFIGS = tuple(e.config for e in ALGORITHMS.values())
