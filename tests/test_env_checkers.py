"""Every hpcrl env passes its ecosystem's own checker: PettingZoo's parallel_api_test, parallel_seed_test and
api_test(parallel_to_aec(env)) for the multi-agent ones, Gymnasium's check_env for the single-agent ones.

The batched ids (``hpcrl/CartPole-v1`` ...) are ``gymnasium.vector.VectorEnv`` s, which check_env does not
take (it checks one ``gymnasium.Env``); tests/test_classic_envs.py holds them to Gymnasium's reference
transitions. Each env is built small (short spin-ups, tiny grids) so the file takes seconds.
"""
from __future__ import annotations

import importlib.util
import shutil
import warnings

import pytest

from hpcrl.envs import hpcrl_env_ids, make, spec


def _tiny_les(cache):
    return dict(les_n=16, dns_n=64, kp=3.0, re=500.0, t_end=0.4, interval=0.1, cache_dir=str(cache))


# id -> (kwargs given the cache folder, what it needs or None)
SMALL = {
    "hpcrl/Lorenz-v0": (lambda cache: {}, None),
    "hpcrl/KraichnanLES-v0": (_tiny_les, None),
    "hpcrl/KraichnanLESProbes-v0": (_tiny_les, None),
    "hpcrl/FoamRelaxation-v0": (lambda cache: dict(work_dir=str(cache), iterations_per_step=4, max_iterations=8,
                                                    history=1), "simpleFoam"),
    "hpcrl/TurbulentChannelWM-v0": (lambda cache: dict(preset="tiny", cache_dir=str(cache), max_actions=5,
                                                       spinup_steps=200, snapshots=2, snapshot_every=100), None),
    "hpcrl/Atari-v5": (lambda cache: dict(game="Pong"), "ale_py"),
    "hpcrl/SpaceInvaders-v5": (lambda cache: {}, "ale_py"),
    "hpcrl/Qbert-v5": (lambda cache: {}, "ale_py"),
    "hpcrl/Gravitar-v5": (lambda cache: {}, "ale_py"),
    "hpcrl/MPESimpleSpread-v3": (lambda cache: {}, "mpe2"),
    "hpcrl/MPESimpleAdversary-v3": (lambda cache: {}, "mpe2"),
}
CYCLES = 30


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("env-checker-cache")


SLOW = {"hpcrl/TurbulentChannelWM-v0"}  # a channel spin-up: seconds


def _ids(kind: str) -> list:
    return [pytest.param(i, marks=pytest.mark.slow) if i in SLOW else i
            for i in hpcrl_env_ids() if spec(i).kind == kind]


def _needs(what: str | None) -> None:
    if what is None:
        return
    if what == "simpleFoam":
        if shutil.which("simpleFoam") is None and not list(__import__("pathlib").Path("/usr/lib/openfoam").glob("*/bin")):
            pytest.skip("OpenFOAM not installed (apt-get install openfoam; scripts/install_system_deps.sh)")
    elif importlib.util.find_spec(what) is None:
        pytest.skip(f"{what} not installed (pip install -e '.[all]')")


def _build(env_id: str, cache):
    kwargs, needs = SMALL[env_id]
    _needs(needs)
    return lambda: make(env_id, **kwargs(cache))


def test_every_hpcrl_env_has_a_checker_entry():
    missing = sorted({i for i in hpcrl_env_ids() if spec(i).kind in ("gym", "parallel")} - set(SMALL))
    assert not missing, f"add these ids to SMALL in this file so their checkers run: {missing}"


@pytest.mark.parametrize("env_id", _ids("gym"))
@pytest.mark.slow
def test_gymnasium_check_env(env_id, cache):
    from gymnasium.utils.env_checker import check_env

    env = _build(env_id, cache)()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # unbounded Box warnings are expected for solver envs
            check_env(env, skip_render_check=True)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", _ids("parallel"))
def test_pettingzoo_checkers(env_id, cache):
    from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test
    from pettingzoo.utils.conversions import parallel_to_aec

    build = _build(env_id, cache)
    parallel_api_test(build(), num_cycles=CYCLES)
    parallel_seed_test(build, num_cycles=CYCLES)
    api_test(parallel_to_aec(build()), num_cycles=CYCLES)
