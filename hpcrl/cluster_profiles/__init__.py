"""Cluster profiles: the machine a simulated job (``launch.runner: sim``) runs on, in virtual time.

A profile is a YAML file (the shipped ones beside this module: ``hpcrl profiles`` lists them; a path names
your own) with:

- ``nodes``: node kinds, each ``count`` nodes of ``cores`` cores and ``gpus`` GPUs, a core ``cpu_speed`` times
  as fast as the core the costs were measured on, and a ``price_per_hour`` per node;
- ``network``: the links between nodes (``latency_seconds``, ``bytes_per_second``; a node kind's
  ``nic_bytes_per_second`` overrides it); rank 0's link is one shared resource: its weight fetches and pushes
  queue on it;
- ``costs``: seconds per operation on a core of ``cpu_speed`` 1 (the scale model's operations,
  hpcrl/bench/scale_predict.py ``Costs``): ``env_step`` per env id (one env step with its share of the
  policy's forward pass), a minibatch ``gradient`` on a CPU core and on a GPU (``fixed`` +
  ``per_sample_float`` x rows x weights), and the transport's operations (``fixed`` + ``per_float`` x weights);
- ``stragglers``: each fragment's time times a seeded log-normal factor (``sigma``), and a ``slow_share`` of the
  actors ``slow_factor`` times slower throughout;
- ``start_seconds``: virtual seconds before a rank's first step (the measured or cited start-up);
- ``sources``: where each number comes from (shown by ``hpcrl profiles NAME``);
- ``costs_from``: take another profile's ``costs`` and change only those given here.

:func:`load_profile` reads one (a name or a path) and refuses a malformed one in one line;
:func:`place` puts a job's ranks on the profile's nodes or says in one line why they do not fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

HERE = Path(__file__).resolve().parent


class ProfileError(ValueError):
    """A profile that cannot be read, or a job it cannot hold: the message is one line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeKind(_Strict):
    name: str
    count: int = Field(ge=1)
    cores: int = Field(ge=1)
    gpus: int = Field(0, ge=0)
    cpu_speed: float = Field(1.0, gt=0)
    """How many times faster a core is than the one ``costs`` were measured on."""
    price_per_hour: float = Field(0.0, ge=0)
    """Dollars per node-hour (the bill of ``hpcrl analyze``'s serverful model)."""
    nic_bytes_per_second: float | None = Field(None, gt=0)
    """This kind's injection bandwidth (None: the network's)."""


class Network(_Strict):
    latency_seconds: float = Field(ge=0)
    bytes_per_second: float = Field(gt=0)
    """A node's injection bandwidth; rank 0's is shared by every fetch and push."""


class Linear(_Strict):
    """``fixed + per_float * weights`` seconds."""

    fixed: float = Field(0.0, ge=0)
    per_float: float = Field(0.0, ge=0)

    def at(self, floats: int) -> float:
        return self.fixed + self.per_float * floats


class Gradient(_Strict):
    """A minibatch gradient: ``fixed + per_sample_float * rows * weights`` seconds."""

    fixed: float = Field(0.0, ge=0)
    per_sample_float: float = Field(0.0, ge=0)

    def at(self, rows: int, floats: int) -> float:
        return self.fixed + self.per_sample_float * rows * floats


class Costs(_Strict):
    env_step: dict[str, float]
    """Env id -> seconds of one env step (with its share of the policy's forward pass) on one core."""
    gradient: Gradient
    """A minibatch gradient on a CPU core."""
    gpu_gradient: Gradient | None = None
    """A minibatch gradient on a GPU (learner ranks on GPU nodes); None: the profile has no GPU nodes."""
    prepare_per_step: float = Field(0.0, ge=0)
    """A learner's batch preparation (PPO: GAE with the value network) per env step."""
    record_per_step: float = Field(0.0, ge=0)
    """An actor's fragment written to its trajectory file, per env step."""
    push: Linear
    receive: Linear
    admit: float = Field(ge=0)
    apply_gradient: Linear
    apply_update: Linear
    publish: Linear
    fetch: Linear
    fragment_send: float = Field(ge=0)
    report: float = Field(ge=0)


class Stragglers(_Strict):
    sigma: float = Field(0.0, ge=0)
    """Each fragment's time is multiplied by exp(N(0, sigma^2)), drawn from the run's seed and the actor."""
    slow_share: float = Field(0.0, ge=0, le=1)
    slow_factor: float = Field(1.0, ge=1)


class Profile(_Strict):
    name: str
    description: str
    nodes: tuple[NodeKind, ...] = Field(min_length=1)
    network: Network
    costs: Costs
    stragglers: Stragglers = Stragglers()
    start_seconds: float = Field(0.0, ge=0)
    oversubscribe: bool = False
    """True: more ranks than cores is allowed (a node's ranks then share its cores, as on this machine)."""
    time_slice_seconds: float | None = Field(None, gt=0)
    """How a node's ranks share its cores when more want one than it has: null, first come first served (a rank
    holds a core for the whole of each piece of work); a time in seconds, round robin in slices of it, as the OS
    shares an oversubscribed node: after each slice the work gives its core up when another rank waits for one,
    so a short piece of work (a push, an apply) is not held behind a whole fragment's sampling."""
    placement: Literal["learners_on_gpu_nodes"] = "learners_on_gpu_nodes"
    sources: dict[str, str] = {}

    @property
    def total_nodes(self) -> int:
        return sum(k.count for k in self.nodes)

    def env_step(self, env_id: str) -> float:
        return self.costs.env_step[env_id]


def shipped() -> list[str]:
    """Names of the profiles in the package."""
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    """The profile a name (shipped) or a path names; ProfileError (one line) when there is none or it is malformed."""
    path = Path(name_or_path)
    if not path.suffix:
        path = HERE / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ProfileError(f"launch.profile={name_or_path!r}: no such cluster profile; shipped: "
                               f"{', '.join(shipped())} (or a path to a YAML file)")
    elif not path.is_file():
        raise ProfileError(f"launch.profile={name_or_path!r}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "costs_from" in data:  # another profile's costs, with these changed
            base = load_profile(str(data.pop("costs_from"))).costs.model_dump()
            data["costs"] = {**base, **(data.get("costs") or {})}
            data.setdefault("sources", {})
        return Profile.model_validate(data)
    except yaml.YAMLError as exc:
        raise ProfileError(f"cluster profile {path.name}: not YAML ({str(exc).splitlines()[0]})") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ProfileError(f"cluster profile {path.name}: {where}: {err['msg']}") from None


@dataclass(frozen=True)
class Slot:
    """Where one rank runs: its node (index into the expanded node list), the node's kind, and its GPU (or None)."""

    node: int
    kind: NodeKind
    gpu: int | None


def place(profile: Profile, learner_ranks: int, actors: int, env_id: str) -> list[Slot]:
    """A slot per rank in role order (the parameter rank, the learner ranks, the actors).

    The parameter rank takes a core of the first node (a GPU node where there is one); learner ranks take the GPU
    nodes' GPUs, one rank a GPU, node after node (the CPU nodes' cores where there are no GPUs); actors take the
    CPU nodes' cores, then the GPU nodes' free cores. ProfileError (one line) when the job does not fit, or when
    the profile has no cost for the job's env."""
    if env_id not in profile.costs.env_step:
        raise ProfileError(f"cluster profile {profile.name}: no costs.env_step for env {env_id!r} (it has "
                           f"{', '.join(sorted(profile.costs.env_step)) or 'none'}); add one, measured with "
                           "`hpcrl bench scale-model --json`")
    nodes = [kind for kind in sorted(profile.nodes, key=lambda k: -k.gpus) for _ in range(kind.count)]
    free = [k.cores for k in nodes]
    gpus = [k.gpus for k in nodes]
    slots = [Slot(0, nodes[0], None)]
    free[0] -= 1
    gpu_nodes = [i for i, k in enumerate(nodes) if k.gpus]
    for _ in range(learner_ranks):
        i = next((i for i in gpu_nodes if gpus[i] and free[i]), None)
        if i is not None:
            slots.append(Slot(i, nodes[i], nodes[i].gpus - gpus[i]))
            gpus[i] -= 1
            free[i] -= 1
        elif gpu_nodes:
            raise _too_small(profile, learner_ranks, actors, "learner ranks, one a GPU")
        else:
            slots.append(_core(profile, nodes, free, learner_ranks, actors, order=range(len(nodes))))
    cpu_first = [i for i, k in enumerate(nodes) if not k.gpus] + gpu_nodes
    for _ in range(actors):
        slots.append(_core(profile, nodes, free, learner_ranks, actors, order=cpu_first))
    return slots


def _core(profile: Profile, nodes, free: list[int], learner_ranks: int, actors: int, order) -> Slot:
    i = next((i for i in order if free[i] > 0), None)
    if i is None:
        if not profile.oversubscribe:
            raise _too_small(profile, learner_ranks, actors, "ranks, one a core")
        i = max(order, key=lambda j: free[j])  # the least loaded node's cores are shared
    free[i] -= 1
    return Slot(i, nodes[i], None)


def _too_small(profile: Profile, learner_ranks: int, actors: int, what: str) -> ProfileError:
    have = ", ".join(f"{k.count} x {k.name} ({k.cores} cores, {k.gpus} GPUs)" for k in profile.nodes)
    return ProfileError(f"cluster profile {profile.name} ({have}) cannot hold the job's {what}: 1 parameter rank, "
                        f"{learner_ranks} learner ranks and {actors} actors; use fewer learners.groups or "
                        "actors.count, or a larger profile")
