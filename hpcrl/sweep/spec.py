"""A sweep spec: configs x arms (or a grid of values) x seeds, read from YAML and checked before anything runs.

::

    name: fig11                     # optional (default: the file's stem); letters, digits, '.', '_', '-'
    config: stellaris/hopper_ppo.yaml   # one config, or ``configs: {hopper: A.yaml, walker: B.yaml}`` (or a list;
                                    # an entry may be {config: A.yaml, overrides: [...]}: that config's own)
    overrides: [launch.runner=sim, launch.profile=stellaris-hpc]   # every run
    arms:                           # name -> overrides (optional)
      sync: [aggregation.policy=sync]
      stellaris: [aggregation.policy=stellaris]
    grid:                           # key -> values, every combination (optional; with arms: arms x grid)
      aggregation.d: [0.92, 0.96]
    seeds: 5                        # 0..4, or a list [0, 7, 9]: env.seed of each run
    parallel: 2                     # runs at a time on this machine, or tasks at a time in a job array

A config path is read relative to the spec's folder, else as one of the package's configs (``hpcrl/configs``). A
spec that is not a file is looked up by name among the shipped ones (``hpcrl/sweeps/NAME.yaml``).

Runs go config by config, seed by seed, every arm of a seed before the next seed (a sweep stopped part way holds
whole seeds of every arm). A run is named ``[CONFIG-]ARM-sSEED`` (the config's name only with several configs; the
arm ``base`` with neither arms nor grid); its overrides are, in order: the spec's, its config's own, the arm's, the
grid point's, ``env.seed``. Every run's config is built and validated here (:func:`hpcrl.config.load_config`), so a
bad key or value in any of them is one line before any run starts.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpcrl.errors import ConfigError

KEYS = ("name", "config", "configs", "overrides", "arms", "grid", "seeds", "parallel")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,-]{0,99}$")
PACKAGE_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PACKAGE_SPECS = Path(__file__).resolve().parents[1] / "sweeps"
"""The shipped specs (the papers' experiments): ``hpcrl sweep NAME`` finds ``hpcrl/sweeps/NAME.yaml``."""


@dataclass(frozen=True)
class SweepRun:
    """One run of the sweep: its name, its config file, its overrides (in the order they apply), and its place."""

    name: str
    config: str
    overrides: tuple[str, ...]
    config_name: str
    arm: str
    seed: int

    def config_sha256(self) -> str:
        return hashlib.sha256(Path(self.config).read_bytes()).hexdigest()


@dataclass(frozen=True)
class SweepSpec:
    name: str
    path: str
    runs: tuple[SweepRun, ...]
    parallel: int

    def run(self, name: str) -> SweepRun:
        for r in self.runs:
            if r.name == name:
                return r
        raise ConfigError(f"sweep {self.name}: no run named {name!r}")


def _fail(path: Path, what: str) -> ConfigError:
    return ConfigError(f"sweep spec {path}: {what}")


def _overrides(path: Path, where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(o, str) and "=" in o for o in value):
        raise _fail(path, f"{where}: expected a list of KEY=VALUE strings, got {value!r}")
    return tuple(value)


def _config_path(path: Path, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, f"a config is a file name, got {value!r}")
    for candidate in (path.parent / value, PACKAGE_CONFIGS / value):
        if candidate.is_file():
            return str(candidate.resolve())
    raise _fail(path, f"config {value!r} not found (looked in {path.parent} and in the package's configs)")


def _configs(path: Path, data: dict) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Config name -> (its file, its own overrides): ``configs`` entries are a file, or ``{config: FILE,
    overrides: [...]}`` for settings only that config takes (its batch, when the configs' algorithms differ)."""
    if ("config" in data) == ("configs" in data):
        raise _fail(path, "give exactly one of 'config' (one file) and 'configs' (a list, or name: file)")
    if "config" in data:
        return {Path(str(data["config"])).stem: (_config_path(path, data["config"]), ())}
    configs = data["configs"]
    if isinstance(configs, list):
        configs = {Path(str(c)).stem: c for c in configs}
    if not isinstance(configs, dict) or not configs:
        raise _fail(path, f"configs: expected a non-empty list or mapping, got {configs!r}")
    out = {}
    for name, entry in configs.items():
        if isinstance(entry, dict):
            extra = [k for k in entry if k not in ("config", "overrides")]
            if extra or "config" not in entry:
                raise _fail(path, f"configs.{name}: expected a file, or config: FILE and overrides: [...]")
            out[str(name)] = (_config_path(path, entry["config"]), _overrides(path, f"configs.{name}.overrides",
                                                                             entry.get("overrides")))
        else:
            out[str(name)] = (_config_path(path, entry), ())
    return out


def _arms(path: Path, data: dict) -> dict[str, tuple[str, ...]]:
    """Arm name -> overrides: the named arms x the grid's points (``base`` when there are neither)."""
    arms = data.get("arms")
    if arms is not None and (not isinstance(arms, dict) or not arms):
        raise _fail(path, f"arms: expected a non-empty mapping of name: [overrides], got {arms!r} (an empty grid)")
    named = {str(k): _overrides(path, f"arms.{k}", v) for k, v in (arms or {}).items()}
    grid = data.get("grid")
    if grid is not None:
        if not isinstance(grid, dict) or not grid:
            raise _fail(path, f"grid: expected a non-empty mapping of key: [values], got {grid!r} (an empty grid)")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise _fail(path, f"grid.{key}: expected a non-empty list of values, got {values!r} (an empty grid)")
        points = {",".join(f"{k.split('.')[-1]}={_show(v)}" for k, v in zip(grid, combo)):
                  tuple(f"{k}={json.dumps(v)}" for k, v in zip(grid, combo))
                  for combo in itertools.product(*grid.values())}
    else:
        points = {"": ()}
    named = named or {"": ()}
    out = {}
    for (arm, arm_o), (point, point_o) in itertools.product(named.items(), points.items()):
        out["-".join(x for x in (arm, point) if x) or "base"] = arm_o + point_o
    return out


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _seeds(path: Path, value: Any) -> list[int]:
    if isinstance(value, bool) or value is None:
        raise _fail(path, f"seeds: expected a count or a list of integers, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise _fail(path, f"seeds: {value} runs no seed (an empty grid); give a count of 1 or more")
        return list(range(value))
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in value):
        raise _fail(path, f"seeds: expected a count or a non-empty list of integers, got {value!r}")
    if len(set(value)) != len(value):
        raise _fail(path, f"seeds: {value} names a seed twice")
    return list(value)


def load_spec(path: str | Path, check_configs: bool = True) -> SweepSpec:
    """The spec's runs, each run's config validated (``check_configs``); ConfigError (one line) on bad input."""
    from hpcrl.config import load_config

    path = Path(path)
    if not path.is_file() and (PACKAGE_SPECS / f"{path.name.removesuffix('.yaml')}.yaml").is_file():
        path = PACKAGE_SPECS / f"{path.name.removesuffix('.yaml')}.yaml"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in PACKAGE_SPECS.glob("*.yaml")))
        raise ConfigError(f"sweep spec {str(path)!r} not found (shipped specs: {shipped or 'none'})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise _fail(path, f"not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise _fail(path, "expected a mapping of " + ", ".join(KEYS))
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise _fail(path, f"unknown key {unknown[0]!r}; allowed: {', '.join(KEYS)}")
    name = str(data.get("name", path.stem))
    if not NAME.match(name):
        raise _fail(path, f"name {name!r}: letters, digits, '.', '_', '-' only")
    parallel = data.get("parallel", 1)
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise _fail(path, f"parallel: expected an integer of 1 or more, got {parallel!r}")
    configs, arms = _configs(path, data), _arms(path, data)
    common = _overrides(path, "overrides", data.get("overrides"))
    seeds = _seeds(path, data.get("seeds", 1))
    runs = []
    # seed by seed, every arm of a seed before the next seed: a sweep stopped part way holds whole seeds of every arm
    for (cname, (cpath, config_o)), seed, (arm, arm_o) in itertools.product(configs.items(), seeds, arms.items()):
        run_name = "-".join([*([cname] if len(configs) > 1 else []), arm, f"s{seed}"])
        if not NAME.match(run_name):
            raise _fail(path, f"run name {run_name!r}: arms and config names may hold letters, digits, '.', '_', "
                              "'-', '=', ','")
        overrides = (*common, *config_o, *arm_o, f"env.seed={seed}")
        if check_configs:
            try:
                load_config(cpath, list(overrides))
            except ConfigError as exc:
                raise _fail(path, f"run {run_name}: {exc}") from None
        runs.append(SweepRun(run_name, cpath, overrides, cname, arm, seed))
    return SweepSpec(name, str(path.resolve()), tuple(runs), parallel)
