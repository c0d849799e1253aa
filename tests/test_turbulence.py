"""The channel LES, its wall model and the wall-model MARL environment (hpcrl.envs.turbulence)."""
from __future__ import annotations

import numpy as np
import pytest

from hpcrl.envs.turbulence.checks import laminar_poiseuille, poiseuille_startup, projection_divergence
from hpcrl.envs.turbulence.grid import ChannelGrid, Tridiagonal
from hpcrl.envs.turbulence.wall_models import B_LOG, KAPPA, EquilibriumWallModel, log_law_state, log_law_u_tau
from hpcrl.errors import ConfigError


# ---- solver checks ----
def test_laminar_poiseuille_steady_profile_is_second_order():
    coarse = laminar_poiseuille(ny=16, t_end=25.0, dt=0.25, nu=0.25)
    fine = laminar_poiseuille(ny=32, t_end=25.0, dt=0.25, nu=0.25)
    print(f"steady Poiseuille max error / U_c: ny=16 {coarse.error:.2e}, ny=32 {fine.error:.2e}")
    assert fine.error < 4e-3
    assert 3.5 < coarse.error / fine.error < 4.5  # second order on the stretched grid
    assert coarse.disturbance < 1e-12  # the random 3-D disturbance decayed
    assert fine.divergence < 1e-12


def test_laminar_startup_follows_the_analytic_transient():
    coarse = laminar_poiseuille(ny=16, t_end=1.0, dt=0.025, nu=0.25)
    r = laminar_poiseuille(ny=32, t_end=1.0, dt=0.025, nu=0.25)
    print(f"start-up Poiseuille at t=1: max error / U_c ny=16 {coarse.error:.2e}, ny=32 {r.error:.2e}")
    assert r.error < 3e-4
    assert 3.5 < coarse.error / r.error < 4.5  # the transient converges at second order too
    # the series solution itself: at t = 0 it is the state of rest
    assert np.abs(poiseuille_startup(np.linspace(-1, 1, 9), 0.0, 1.0, 0.25)).max() < 1e-6


def test_projection_is_divergence_free_to_round_off():
    after, before = projection_divergence()
    print(f"max|div u|/max|u|: before {before:.2e}, after {after:.2e}")
    assert before > 1.0
    assert after < 1e-12


def test_tridiagonal_solves_complex_right_hand_sides():
    rng = np.random.default_rng(0)
    n = 7
    sub, diag, sup = rng.standard_normal(n), 4 + rng.random(n), rng.standard_normal(n)
    a = np.diag(diag) + np.diag(sub[1:], -1) + np.diag(sup[:-1], 1)
    b = rng.standard_normal((n, 3, 2)) + 1j * rng.standard_normal((n, 3, 2))
    x = Tridiagonal(sub, diag, sup).solve(b)
    np.testing.assert_allclose(np.einsum("ij,jkl->ikl", a, x), b, atol=1e-12)
    # one matrix per column (the projection's per-wavenumber blocks): column c uses diag + c
    per = Tridiagonal(sub[:, None], diag[:, None] + np.arange(3.0), sup[:, None])
    x = per.solve(b)
    for c in range(3):
        np.testing.assert_allclose((a + c * np.eye(n)) @ x[:, c], b[:, c], atol=1e-12)
    with pytest.raises(np.linalg.LinAlgError, match="zero pivot in row 1"):
        Tridiagonal(np.ones(3), np.ones(3), np.ones(3))  # [[1,1,0],[1,1,1],...]: pivot 1 - 1 = 0


def test_grid_rejects_bad_sizes():
    with pytest.raises(ConfigError, match="grid.nx"):
        ChannelGrid(15, 16, 16)
    g = ChannelGrid(16, 24, 16, stretch=2.0)
    assert g.dy[0] < g.dy[12] and abs(g.dy.sum() - 2.0) < 1e-14 and g.dy[0] == pytest.approx(g.dy[-1])


# ---- wall model ----
@pytest.mark.parametrize("u_tau", [0.3, 1.0, 2.5])
@pytest.mark.parametrize("h", [0.05, 0.2])
def test_log_law_newton_recovers_u_tau(u_tau, h):
    nu = 1.0 / 2000
    speed = u_tau * (np.log(h * u_tau / nu) / KAPPA + B_LOG)  # the log law, forwards
    got = log_law_u_tau(np.array([speed, 2 * speed]), h, nu)
    assert got[0] == pytest.approx(u_tau, rel=1e-12)
    # doubling U at fixed h: u_tau rises by less than a factor 2 (U+ grows with ln h+)
    assert 1.0 < got[1] / got[0] < 2.0


def test_log_law_known_value_and_viscous_fallback():
    # Re_tau = 1000, h = 0.1: h+ = 100, U+ = ln(100)/0.41 + 5.2 = 16.4320...
    assert log_law_u_tau(np.array([16.432122]), 0.1, 1e-3)[0] == pytest.approx(1.0, rel=1e-6)
    # h+ < 11: the viscous sublayer tau_w = nu U / h
    wm = EquilibriumWallModel(h=0.01, nu=1e-3)
    assert wm(np.array([0.5]))[0] == pytest.approx(1e-3 * 0.5 / 0.01)
    assert wm(np.array([0.0]))[0] == 0.0


def test_log_law_state_is_kappa_and_b_on_the_log_law():
    nu, h, u_tau = 1.0 / 2000, 0.1, 1.3
    speed = u_tau * (np.log(h * u_tau / nu) / KAPPA + B_LOG)
    dudy = u_tau / (KAPPA * h)
    inv_k, b = log_law_state(np.array(speed), np.array(dudy), np.array(u_tau**2), h, nu)
    assert inv_k == pytest.approx(1 / KAPPA) and b == pytest.approx(B_LOG)


# ---- the MARL environment ----
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("turbulence-cache")


# a short spin-up (t = 1.6, still transitional) keeps the tests to seconds; the full tiny spin-up
# and the turbulence statistics are in `hpcrl bench turbulence`
SHORT = dict(spinup_steps=200, snapshots=2, snapshot_every=100)


@pytest.mark.slow
def test_env_passes_pettingzoo_parallel_api_test(cache_dir):
    from pettingzoo.test import parallel_api_test

    from hpcrl.envs.turbulence.env import TurbulentChannelEnv

    env = TurbulentChannelEnv("tiny", cache_dir=cache_dir, max_actions=5, **SHORT)
    parallel_api_test(env, num_cycles=10)
    assert len(env.possible_agents) == 2 * 4 * 4
    assert list(cache_dir.glob("channel-tiny-*.npz"))  # the spin-up was cached


def test_env_actions_scale_the_wall_stress_and_rewards_track_the_error(cache_dir):
    from hpcrl.envs.turbulence.env import TurbulentChannelEnv

    env = TurbulentChannelEnv("tiny", cache_dir=cache_dir, max_actions=3, **SHORT)
    obs, _ = env.reset(seed=3, options={"snapshot": 0, "tau_factor": 1.2})
    tau0 = env.metrics()["mean_tau_w"]
    obs, rew, term, trunc, info = env.step({a: np.array([0.9], np.float32) for a in env.agents})
    assert env.metrics()["mean_tau_w"] == pytest.approx(0.9 * tau0, rel=1e-9)  # uniform factor: exact
    # reward = the drop of the local relative error (plus the bonus within 1%)
    a = env.agents[0]
    err_before = abs(1.0 - info[a]["tau_w"] / 0.9)
    expected = err_before - info[a]["rel_error"] + (0.1 if info[a]["rel_error"] < 0.01 else 0.0)
    assert rew[a] == pytest.approx(expected, abs=1e-9)
    # out-of-range actions are clipped to [0.9, 1.1]
    before = env.metrics()["mean_tau_w"]
    env.step({a: np.array([5.0], np.float32) for a in env.agents})
    assert env.metrics()["mean_tau_w"] == pytest.approx(1.1 * before, rel=1e-9)
    *_, trunc, _ = env.step({})
    assert env.agents == [] and all(trunc.values())


def test_env_rejects_bad_settings():
    from hpcrl.envs.turbulence.env import TurbulentChannelEnv

    with pytest.raises(ConfigError, match="env.preset"):
        TurbulentChannelEnv("huge")
    with pytest.raises(ConfigError, match="env.action_low"):
        TurbulentChannelEnv("tiny", action_low=1.1, action_high=1.2)
    with pytest.raises(ConfigError, match="env.preset overrides"):
        TurbulentChannelEnv("tiny", grid_points=3)


def test_env_is_registered():
    from hpcrl.envs.registry import spec

    s = spec("hpcrl/TurbulentChannelWM-v0")
    assert s is not None and s.kind == "parallel"
    assert s.load().__name__ == "TurbulentChannelEnv"
    from hpcrl.envs import make

    env = make("hpcrl/TurbulentChannelWM-v0", preset="tiny", max_actions=7)  # construction spins up nothing
    assert env.preset.name == "tiny" and env.preset.max_actions == 7 and len(env.possible_agents) == 32
