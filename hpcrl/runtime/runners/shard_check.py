"""What a job with parameter shards (``aggregation.shards`` > 1) needs beyond its config: checked by ``hpcrl run``
before anything starts (one line, exit 2), since it needs the model.

- every shard owns a slice of the model's flat buffer, cut where ``runtime/shards.py`` allows (a tensor's start or
  a 512-float block of one): S is at most the number of such places;
- the algorithm steps the weights element by element with the runtime's aggregate (``Algorithm.aggregate``,
  ``apply`` and ``make_optimizer`` its own, not overridden): what makes S slices step as one buffer does. HDDPG,
  HA2C and the MARL algorithms step by blocks or on their own, so they run with one parameter rank.
"""
from __future__ import annotations

import torch

from hpcrl.algos.base import Algorithm
from hpcrl.errors import ConfigError
from hpcrl.runtime.plan import Plan
from hpcrl.runtime.shards import bounds, param_sizes

STEPPED_BY_THE_RUNTIME = ("aggregate", "apply", "make_optimizer")


def check_shards(plan: Plan) -> None:
    """ConfigError (one line) when this job's model or algorithm cannot be split over ``plan.shards`` ranks."""
    from hpcrl.runtime.roles.sampler import describe_env
    from hpcrl.runtime.runners.job import role_parts

    S, s = plan.shards, plan.sections
    algo, model, _ = role_parts(plan, describe_env(s.env), torch.device("cpu"))
    own = [name for name in STEPPED_BY_THE_RUNTIME if getattr(type(algo), name) is not getattr(Algorithm, name)]
    if own:
        raise ConfigError(f"aggregation.shards={S}: algo {s.algo.name} has its own {own[0]} (it steps the weights "
                          "as a whole); allowed: aggregation.shards=1, or an algorithm such as ppo or impact")
    try:
        bounds(param_sizes(model), S)
    except ValueError as exc:
        raise ConfigError(f"aggregation.shards={S}: the model's {exc}") from None
