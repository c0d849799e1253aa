"""Environment ids a config can name.

hpcrl's own environments are listed here by import path, so naming one never imports the
others (the turbulence solver, OpenFOAM drivers and batched torch envs are heavy). Any
Gymnasium id also works, a user's own too: one that a module registers when imported, named by
``env.imports`` (:func:`import_env_modules`) or in the id as Gymnasium's ``module:Id``
(docs/own-env.md). Kinds:

- ``gym``: a ``gymnasium.Env`` (actor ranks vectorise it themselves),
- ``parallel``: a PettingZoo ``ParallelEnv`` (multi-agent),
- ``batched``: a tensor ``gymnasium.vector.VectorEnv`` stepping N instances on CPU or CUDA.
"""
from __future__ import annotations

import difflib
import importlib
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from hpcrl.errors import ConfigError

Kind = Literal["gym", "parallel", "batched"]
MODULE_NAME = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"
"""A module's dotted name (what env.imports and the module of a ``module:Id`` id may hold)."""


@dataclass(frozen=True)
class EnvSpec:
    id: str
    entry_point: str  # "module:attribute"
    kind: Kind
    description: str = ""
    copies: str = ""
    """A parallel env's "module:attribute" of ``f(count, **kwargs)``: ``count`` copies stepped together, each the
    same as the env's, or None for kwargs it does not implement (then the actor steps the env's copies)."""

    def load(self) -> Any:
        return _attribute(self.entry_point)

    def load_copies(self) -> Any:
        """The ``copies`` function, or None when the env has none."""
        return _attribute(self.copies) if self.copies else None


def _attribute(entry: str) -> Any:
    """What a "module:attribute" string names, the module imported."""
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


_SPECS: dict[str, EnvSpec] = {}


def register(id: str, entry_point: str, kind: Kind, description: str = "", copies: str = "") -> None:
    """Add one of hpcrl's environments (called at the bottom of this file, once per env)."""
    if id in _SPECS:
        raise ValueError(f"environment id {id!r} registered twice")
    _SPECS[id] = EnvSpec(id, entry_point, kind, description, copies)


def hpcrl_env_ids() -> list[str]:
    return sorted(_SPECS)


def spec(env_id: str) -> EnvSpec | None:
    return _SPECS.get(env_id)


def import_env_modules(modules: Iterable[str], field: str = "env.imports") -> None:
    """Import each module (its import registers the user's Gymnasium ids); ConfigError naming the first that fails.

    Called before the id is checked (the launcher) and before a rank makes its env (``make_backend``): each
    process imports for itself, as ranks forked by the prestart server do not share the launcher's imports."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            where = " (install it, or put its folder on PYTHONPATH)" if isinstance(exc, ModuleNotFoundError) else ""
            raise ConfigError(f"{field}: cannot import {name!r}: {first}{where}") from None


def check_env_id(env_id: str, imports: Iterable[str] = ()) -> None:
    """Raise ConfigError unless env_id names an hpcrl env or a registered Gymnasium env, after importing ``imports``
    (``env.imports``) and, for Gymnasium's ``module:Id``, the module."""
    imports = list(imports)
    import_env_modules(imports)
    if env_id in _SPECS:
        return
    name = env_id
    if ":" in env_id:  # Gymnasium's convention: import the module, then look the id up
        module, _, name = env_id.partition(":")
        if not re.match(MODULE_NAME, module) or not name:
            raise ConfigError(f"env.id: {env_id!r} is not Gymnasium's 'module:Id' (e.g. my_pkg.envs:MyEnv-v0)")
        import_env_modules([module], field=f"env.id {env_id!r}")
        imports.append(module)
    import gymnasium

    if name in gymnasium.registry:
        return
    known = list(_SPECS) + list(gymnasium.registry)
    close = [k for k in known if name.split("-")[0].lower() in k.lower()][:5] or difflib.get_close_matches(name, known)
    listed = "" if imports else f"; hpcrl envs: {', '.join(hpcrl_env_ids())}"
    hint = f" (did you mean {', '.join(close)}?)" if close else listed
    if imports:
        own = (f"; the module whose import calls gymnasium.register({name!r}, ...) belongs in env.imports "
               f"(docs/own-env.md)")
        raise ConfigError(f"env.id: unknown environment {name!r} after importing {', '.join(imports)}{hint}{own}")
    own = ("; an id your own package registers needs its module in env.imports (e.g. env.imports: [my_pkg.envs]) "
           "or env.id: my_pkg.envs:MyEnv-v0 (docs/own-env.md)")
    raise ConfigError(f"env.id: unknown environment {env_id!r}{hint}{own}")


def make(env_id: str, **kwargs: Any) -> Any:
    """Construct one environment by id: hpcrl's own first, then Gymnasium's."""
    check_env_id(env_id)
    s = _SPECS.get(env_id)
    if s is not None:
        return s.load()(**kwargs)
    import gymnasium

    return gymnasium.make(env_id, **kwargs)


# hpcrl's environments: each helper module adds its line here.
register("hpcrl/Lorenz-v0", "hpcrl.envs.parrl.lorenz:LorenzEnv", "gym", "PAR-RL Lorenz control: perturb rho, sigma, beta to keep transient chaos alive")
register("hpcrl/KraichnanLES-v0", "hpcrl.envs.parrl.les2d:KraichnanLESEnv", "gym", "PAR-RL 2D LES closure: one Smagorinsky Cs^2 for a 32^2 LES of Kraichnan turbulence vs filtered 256^2 DNS")
register("hpcrl/KraichnanLESProbes-v0", "hpcrl.envs.parrl.les2d_marl:KraichnanLESParallelEnv", "parallel", "PAR-RL 2D LES closure, 16 probe agents each setting the local Cs^2")
register("hpcrl/CartPole-v1", "hpcrl.envs.classic.cartpole:CartPole", "batched", "CartPole-v1 as N tensor instances on CPU/CUDA (seed 003), Gymnasium-exact, SAME_STEP autoreset")
register("hpcrl/FoamRelaxation-v0", "hpcrl.envs.parrl.openfoam:FoamRelaxationEnv", "gym", "PAR-RL OpenFOAM dynamic relaxation: SIMPLE relaxation factors for simpleFoam on pitzDaily (needs apt openfoam)")
register("hpcrl/TurbulentChannelWM-v0", "hpcrl.envs.turbulence.env:TurbulentChannelEnv", "parallel", "Bae & Koumoutsakos wall-model MARL: agents on both walls of a WMLES channel (Re_tau 2000) scale the local wall stress")
register("hpcrl/Acrobot-v1", "hpcrl.envs.classic.acrobot:Acrobot", "batched", "Acrobot-v1 as N tensor instances on CPU/CUDA (seed 003), RK4 as Gymnasium, SAME_STEP autoreset")
register("hpcrl/Pendulum-v1", "hpcrl.envs.classic.pendulum:Pendulum", "batched", "Pendulum-v1 as N tensor instances on CPU/CUDA (seed 003), continuous torque, SAME_STEP autoreset")
register("hpcrl/MountainCar-v0", "hpcrl.envs.classic.mountain_car:MountainCar", "batched", "MountainCar-v0 as N tensor instances on CPU/CUDA, SAME_STEP autoreset")
register("hpcrl/MountainCarContinuous-v0", "hpcrl.envs.classic.mountain_car:MountainCarContinuous", "batched", "MountainCarContinuous-v0 as N tensor instances on CPU/CUDA, SAME_STEP autoreset")
register("hpcrl/Atari-v5", "hpcrl.envs.atari:make_atari", "gym", "any ALE game (env.kwargs.game) with the standard preprocessing: no-op starts, frame skip 4 with max-pool, grey 84x84, 4 stacked uint8 frames (needs ale-py)")
register("hpcrl/SpaceInvaders-v5", "hpcrl.envs.atari:space_invaders", "gym", "Stellaris workload: SpaceInvaders with the standard Atari preprocessing (hpcrl/Atari-v5)")
register("hpcrl/Qbert-v5", "hpcrl.envs.atari:qbert", "gym", "Stellaris workload: Qbert with the standard Atari preprocessing (hpcrl/Atari-v5)")
register("hpcrl/Gravitar-v5", "hpcrl.envs.atari:gravitar", "gym", "Stellaris workload: Gravitar with the standard Atari preprocessing (hpcrl/Atari-v5)")
register("hpcrl/MPESimpleSpread-v3", "hpcrl.envs.mpe:simple_spread", "parallel", "MARLess workload: MPE simple-spread, N=6 cooperating agents cover 6 landmarks, 25 steps (needs mpe2)",
         copies="hpcrl.envs.mpe_spread_copies:spread_copies")
register("hpcrl/MPESimpleAdversary-v3", "hpcrl.envs.mpe:simple_adversary", "parallel", "MARLess workload: MPE simple-adversary, 1 adversary + N=5 good agents, observations zero-padded to one space, 25 steps (needs mpe2)")
