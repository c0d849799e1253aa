"""PAR-RL workloads: Lorenz control, 2D LES closure, OpenFOAM dynamic relaxation."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from hpcrl.envs import make, spec
from hpcrl.envs.parrl.lorenz import LorenzEnv, rk4


def _check(env) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unbounded Box warnings are expected here
        check_env(env, skip_render_check=True)


# ---------------------------------------------------------------- Lorenz

def test_lorenz_passes_env_checker():
    _check(LorenzEnv())


def test_lorenz_rk4_converges_to_fixed_point_without_control():
    # rho = 20 is transiently chaotic: the uncontrolled orbit ends on C+- = (+-sqrt(beta(rho-1)), ., rho-1).
    x, y, z = rk4((1.0, 1.0, 1.0), 0.002, 200_000, 20.0, 10.0, 8.0 / 3.0)
    c = np.sqrt(8.0 / 3.0 * 19.0)
    assert abs(abs(x) - c) < 1e-6 and abs(y - x) < 1e-6 and abs(z - 19.0) < 1e-6


def test_lorenz_uncontrolled_episode_terminates_with_penalty():
    env = LorenzEnv(episode_steps=400, judged_steps=200)
    env.reset(seed=3)
    rewards = []
    while True:
        obs, r, terminated, truncated, info = env.step(np.zeros(3, np.float32))
        rewards.append(r)
        if terminated or truncated:
            break
    assert terminated and not truncated and len(rewards) == 400
    assert rewards[-1] == -100.0
    assert set(rewards[:-1]) <= {10.0, -10.0}
    assert rewards[-2] == -10.0  # settled on a fixed point: speed ~ 0


def test_lorenz_reward_follows_speed_and_action_scales_parameters():
    env = LorenzEnv()
    env.reset(seed=0)
    obs, r, *_, info = env.step(np.array([1.0, -1.0, 0.5], np.float32))
    assert np.allclose(info["params"], (22.0, 9.0, 8.0 / 3.0 * 1.05))
    assert r == (10.0 if np.linalg.norm(obs[3:]) >= 40.0 else -10.0)
    assert info["speed"] == pytest.approx(float(np.linalg.norm(obs[3:].astype(np.float64))), rel=1e-5)


def test_lorenz_kept_chaotic_is_truncated_not_terminated():
    env = LorenzEnv(episode_steps=50, judged_steps=25, speed_threshold=0.0)  # every step counts as chaotic
    env.reset(seed=1)
    for _ in range(50):
        _, r, terminated, truncated, _ = env.step(env.action_space.sample())
    assert truncated and not terminated and r == 10.0


def test_lorenz_registered():
    assert spec("hpcrl/Lorenz-v0").kind == "gym"
    assert isinstance(make("hpcrl/Lorenz-v0", episode_steps=10, judged_steps=5), LorenzEnv)


# ---------------------------------------------------------------- spectral solver and 2D LES

from hpcrl.envs.parrl.les2d import KraichnanLES, KraichnanLESEnv  # noqa: E402
from hpcrl.envs.parrl.spectral2d import SpectralGrid, kraichnan_initial, spectral_cutoff  # noqa: E402


def _tiny_les(tmp_path, **kw):
    args = dict(les_n=16, dns_n=64, kp=3.0, re=500.0, t_end=0.4, interval=0.1, cache_dir=tmp_path)
    args.update(kw)
    return args


def test_spectral_inviscid_energy_and_enstrophy_conserved_at_third_order():
    g = SpectralGrid(64)
    w0 = kraichnan_initial(g, 4.0, np.random.default_rng(0))
    e0, z0 = g.energy(w0), g.enstrophy(w0)
    drift = []
    for dt, n in ((0.01, 20), (0.005, 40)):
        w = w0
        for _ in range(n):
            w = g.rk3_step(w, dt, nu=0.0)
        assert abs(g.enstrophy(w) - z0) / z0 < 1e-5
        drift.append(abs(g.energy(w) - e0) / e0)
    assert drift[0] < 1e-5
    assert drift[0] / drift[1] > 6.0  # RK3's energy error falls like dt^3 (8x per halving)


def test_spectral_viscous_eigenmode_decays_analytically():
    # omega = sin(3x) cos(4y) + cos(5y): all |k|^2 = 25, so J(psi, omega) = 0 and omega ~ exp(-25 nu t).
    g = SpectralGrid(32)
    x = np.arange(32) * g.dx
    xx, yy = np.meshgrid(x, x)
    w = g.to_spectral(np.sin(3 * xx) * np.cos(4 * yy) + np.cos(5 * yy))
    e0, nu = g.energy(w), 0.01
    for _ in range(100):
        w = g.rk3_step(w, 0.01, nu)
    assert g.energy(w) / e0 == pytest.approx(np.exp(-2 * nu * 25 * 1.0), rel=1e-8)


def test_kraichnan_initial_spectrum_and_cutoff_filter():
    fine, coarse = SpectralGrid(128), SpectralGrid(32)
    w = kraichnan_initial(fine, 5.0, np.random.default_rng(1))
    k = np.arange(1, fine.kmax + 1)
    analytic = 4.0 / (3.0 * np.pi) * 5.0**-5 * k**4 * np.exp(-((k / 5.0) ** 2))
    assert np.allclose(fine.energy_spectrum(w)[1:], analytic, rtol=1e-10)
    assert fine.energy(w) == pytest.approx(1.0 / (2.0 * np.sqrt(np.pi)), rel=1e-6)
    wc = spectral_cutoff(w, fine, coarse)
    assert np.allclose(coarse.energy_spectrum(wc)[1:], fine.energy_spectrum(w)[1:coarse.kmax + 1], rtol=1e-12)
    # the filtered grid field is the fine field's low-pass: equal at the shared grid points when nothing is cut
    smooth = fine.to_spectral(np.cos(2 * np.arange(128) * fine.dx)[None, :] * np.ones((128, 1)))
    assert np.allclose(coarse.to_grid(spectral_cutoff(smooth, fine, coarse)), fine.to_grid(smooth)[::4, ::4])


def test_smagorinsky_only_removes_energy():
    g = SpectralGrid(32)
    w = kraichnan_initial(g, 5.0, np.random.default_rng(2))
    plain, smag = w, w
    for _ in range(20):
        e_before = g.energy(smag)
        plain, smag = g.rk3_step(plain, 0.02, 1e-3), g.rk3_step(smag, 0.02, 1e-3, 0.1)
        assert g.energy(smag) < e_before
    assert g.energy(smag) < 0.9 * g.energy(plain)


def test_les_env_passes_env_checker_and_caches_reference(tmp_path):
    env = KraichnanLESEnv(**_tiny_les(tmp_path))
    _check(env)
    path = env.les.cache_path(0)
    stamp = path.stat().st_mtime_ns
    again = KraichnanLESEnv(**_tiny_les(tmp_path))
    again.reset(seed=0)
    assert path.stat().st_mtime_ns == stamp  # read from the cache, not regenerated
    assert np.array_equal(again.les.reference["w_hat"], env.les.reference["w_hat"])
    assert again.les.reference["w_hat"].shape == (5, 16, 9)


def test_les_on_the_dns_grid_without_closure_reproduces_the_reference(tmp_path):
    # Same grid, Cs^2 = 0: the LES is the DNS, so every spectrum error is round-off.
    env = KraichnanLESEnv(cs2_range=(0.0, 0.5), **_tiny_les(tmp_path, les_n=32, dns_n=32))
    env.reset(seed=0)
    rewards, done = [], False
    while not done:
        _, r, done, truncated, info = env.step(np.array([0.0], np.float32))
        rewards.append(r)
    assert len(rewards) == 4 and max(abs(r) for r in rewards) < 1e-9
    env.reset(seed=0)
    _, r_smag, *_ = env.step(np.array([0.5], np.float32))
    assert r_smag < -1e-3  # the closure changes the spectrum, and the reward sees it


def test_les_probe_interpolation_hits_probe_values():
    les = KraichnanLES(les_n=32, dns_n=32)
    vals = np.arange(16.0).reshape(4, 4)
    field = les.cs2_field(vals)
    assert np.array_equal(field[np.ix_(les.probe_index, les.probe_index)], vals)
    assert field.min() >= 0.0 and field.max() <= 15.0


def test_les_multi_agent_parallel_api(tmp_path):
    pytest.importorskip("pettingzoo")
    from pettingzoo.test import parallel_api_test

    from hpcrl.envs.parrl.les2d_marl import KraichnanLESParallelEnv

    env = KraichnanLESParallelEnv(**_tiny_les(tmp_path))
    parallel_api_test(env, num_cycles=50)
    single = KraichnanLESEnv(**_tiny_les(tmp_path))
    shared = KraichnanLESParallelEnv(global_share=1.0, **_tiny_les(tmp_path))
    single.reset(seed=0)
    shared.reset(seed=0)
    _, r1, *_ = single.step(np.array([0.2], np.float32))
    _, rewards, *_ = shared.step({a: np.array([0.2], np.float32) for a in shared.agents})
    assert len(rewards) == 16 and all(r == pytest.approx(r1, rel=1e-9) for r in rewards.values())


def test_les_registered():
    assert spec("hpcrl/KraichnanLES-v0").kind == "gym"
    assert spec("hpcrl/KraichnanLESProbes-v0").kind == "parallel"


# ---------------------------------------------------------------- OpenFOAM dynamic relaxation

from hpcrl.envs.parrl import foam_case as fc  # noqa: E402

_FOAM_MISSING = (fc.find_bashrc() is None or fc.find_tutorial() is None)
needs_foam = pytest.mark.skipif(
    _FOAM_MISSING, reason="OpenFOAM v1912 not installed: apt-get install openfoam openfoam-examples")

_LOG = """Time = 11

smoothSolver:  Solving for Ux, Initial residual = 0.2, Final residual = 0.01, No Iterations 3
smoothSolver:  Solving for Uy, Initial residual = 0.4, Final residual = 0.02, No Iterations 3
GAMG:  Solving for p, Initial residual = 0.05, Final residual = 0.004, No Iterations 9
GAMG:  Solving for p, Initial residual = 0.01, Final residual = 0.001, No Iterations 4
ExecutionTime = 0.1 s  ClockTime = 0 s

Time = 12

smoothSolver:  Solving for Ux, Initial residual = 0.1, Final residual = 0.01, No Iterations 3
smoothSolver:  Solving for Uy, Initial residual = nan, Final residual = nan, No Iterations 1000
GAMG:  Solving for p, Initial residual = 0.03, Final residual = 0.002, No Iterations 9
GAMG:  Solving for p, Initial residual = 0.02, Final residual = 0.001, No Iterations 4
ExecutionTime = 0.2 s  ClockTime = 0 s

End
"""


def test_foam_log_parser_reads_last_iteration_and_refuses_garbage():
    log = fc.parse_solver_log(_LOG)
    assert log.times == [11.0, 12.0] and log.ended and not log.converged and not log.fatal
    assert log.residuals["Ux"] == 0.1 and log.residuals["p"] == 0.03 and np.isnan(log.residuals["Uy"])
    with pytest.raises(fc.FoamOutputError):
        fc.parse_solver_log("garbage\nwithout iterations\n")
    with pytest.raises(fc.FoamOutputError):
        bad = "smoothSolver:  Solving for Ux, Initial residual = 1.2.3x, Final residual = 1, No Iterations 1"
        fc.parse_solver_log(f"Time = 1\n{bad}\n")
    assert fc.parse_solver_log("--> FOAM FATAL ERROR:\ncannot find file\n").fatal == "FOAM FATAL"


def test_foam_dictionary_and_field_editing():
    text = "FoamFile\n{\n    object U;\n}\ninternalField   nonuniform List<vector> 2((1 2 3) (4 5 6));\n" \
           "boundaryField\n{\n    inlet\n    {\n        type fixedValue;\n        value uniform (10 0 0);\n    }\n" \
           "    outlet\n    {\n        type zeroGradient;\n    }\n}\n"
    cells, inlet = fc.read_vector_field_text(text, "inlet")
    assert cells.tolist() == [[1, 2, 3], [4, 5, 6]] and inlet.tolist() == [[10, 0, 0]]
    text2 = fc.replace_block(text, ["boundaryField", "inlet"], "type fixedValue; value uniform (42 0 0);")
    assert fc.read_vector_field_text(text2, "inlet")[1].tolist() == [[42, 0, 0]]
    assert "zeroGradient" in text2 and fc.set_entry("endTime 5;\n", "endTime", "105") == "endTime 105;\n"
    with pytest.raises(fc.FoamOutputError):
        fc.read_vector_field_text(text.replace("(4 5 6)", "(4 5)"), "inlet")
    with pytest.raises(fc.FoamOutputError):
        fc.read_vector_field_text(text, "missingPatch")


def test_foam_missing_install_gives_install_hint(tmp_path):
    from hpcrl.envs.parrl.openfoam import FoamRelaxationEnv

    with pytest.raises(fc.FoamNotInstalledError, match="apt-get install openfoam openfoam-examples"):
        FoamRelaxationEnv(foam_bashrc=str(tmp_path / "no-bashrc"))


@pytest.fixture
def foam_env(tmp_path):
    from hpcrl.envs.parrl.openfoam import FoamRelaxationEnv

    envs = []

    def make_env(**kw):
        env = FoamRelaxationEnv(work_dir=str(tmp_path), **kw)
        envs.append(env)
        return env

    yield make_env
    for env in envs:
        env.close()


@needs_foam
def test_foam_two_step_episode(foam_env):
    env = foam_env(iterations_per_step=4, max_iterations=8, history=1)
    obs, info = env.reset(seed=0)
    speed = info["inlet_speed"]
    assert 35.0 <= speed <= 65.0 and obs[0] == pytest.approx(speed**2, rel=1e-6) and obs[1] == 0.0
    obs1, r1, term1, trunc1, info1 = env.step(np.array([0.3, 0.7], np.float32))
    fv = (env.case / "system" / "fvSolution").read_text()
    assert "p 0.3;" in fv and "U 0.7;" in fv
    assert (r1, term1, trunc1) == (-4.0, False, False) and info1["iterations"] == 4
    assert 0.0 < obs1[1] < 2.0 * speed**2 and obs1[2] == 0.0  # history holds the previous domain mean
    obs2, r2, term2, trunc2, info2 = env.step(np.array([0.5, 0.5], np.float32))
    assert (r2, term2, trunc2) == (-4.0, False, True) and info2["iterations_total"] == 8
    assert obs2[2] == obs1[1]
    assert sorted(p.name for p in env.case.iterdir() if p.name[0].isdigit()) == ["0", "8"]
    env.reset(seed=1)  # a new episode starts from time 0 again
    assert sorted(p.name for p in env.case.iterdir() if p.name[0].isdigit()) == ["0"]


@needs_foam
@pytest.mark.slow
def test_foam_env_passes_env_checker(foam_env):
    _check(foam_env(iterations_per_step=2, max_iterations=4))


@needs_foam
def test_foam_timeout_kills_solver_and_penalises(foam_env):
    import os

    env = foam_env(iterations_per_step=2000, timeout_s=0.5)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(np.array([0.5, 0.5], np.float32))
    assert (reward, terminated, truncated) == (-2000.0, True, False)
    assert "timeout" in info["failure"]
    with pytest.raises(ProcessLookupError):
        os.killpg(env.last_run.pid, 0)  # the solver's whole process group is gone


@needs_foam
def test_foam_corrupted_case_is_a_penalty_not_a_crash(foam_env):
    env = foam_env(iterations_per_step=2)
    env.reset(seed=0)
    _, r, terminated, *_ = env.step(np.array([0.5, 0.5], np.float32))
    assert r == -2.0 and not terminated
    (env.case / "2" / "U").write_text("this is not a field\n")  # the solver restarts from here
    obs, r, terminated, truncated, info = env.step(np.array([0.5, 0.5], np.float32))
    assert (r, terminated, truncated) == (-2000.0, True, False) and "exited with status" in info["failure"]
    assert np.all(np.isfinite(obs))
    env.reset(seed=0)  # the next episode is clean again
    assert env.step(np.array([0.5, 0.5], np.float32))[1] == -2.0


def test_foam_registered():
    assert spec("hpcrl/FoamRelaxation-v0").kind == "gym"


@needs_foam
def test_foam_divergence_is_a_penalty_not_a_crash(foam_env):
    # 5 km/s with no under-relaxation blows up: simpleFoam dies of SIGFPE inside the first step.
    env = foam_env(iterations_per_step=50, relax_range=(0.2, 1.0))
    obs0, _ = env.reset(seed=0, options={"inlet_speed": 5000.0})
    obs, r, terminated, truncated, info = env.step(np.array([1.0, 1.0], np.float32))
    assert (r, terminated, truncated) == (-2000.0, True, False)
    assert "status" in info["failure"] and np.array_equal(obs, obs0)
