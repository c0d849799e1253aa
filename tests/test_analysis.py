"""analysis/ and `hpcrl analyze`: outputs checked against the HDF5 they came from."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from hpcrl.cli import main as hpcrl_main
from hpcrl.commands.analyze import load_analysis
from hpcrl.io import read_table

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_run import write_synthetic_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ha = load_analysis()
M = ha.metrics


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dirs = {"s0": root / "s0", "s1": root / "s1", "a0": root / "a0"}
    write_synthetic_run(dirs["s0"], "stellaris", seed=0)
    write_synthetic_run(dirs["s1"], "stellaris", seed=1)
    write_synthetic_run(dirs["a0"], "pure_async", seed=2)
    return dirs


@pytest.fixture(scope="module")
def compared(runs, tmp_path_factory):
    """One analysis of two stellaris seeds and one pure_async run."""
    return ha.analyze([runs["s0"], runs["s1"], runs["a0"]], tmp_path_factory.mktemp("compare"))


def read_csv(path):
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    return rows


@pytest.mark.slow
def test_one_run_outputs_match_the_hdf5(runs, tmp_path):
    run_dir = runs["s0"]
    assert hpcrl_main(["analyze", str(run_dir), "--out", str(tmp_path)]) == 0
    rounds, ep = read_table(run_dir, "rounds"), read_table(run_dir, "episodes")
    grads, la = read_table(run_dir, "gradients"), read_table(run_dir, "learner_activity")
    rows = read_csv(tmp_path / "rounds-synth-stellaris.csv")
    assert list(rows[0]) == list(M.CSV_COLUMNS)
    assert [int(r["round_id"]) for r in rows] == rounds["round"].tolist()
    ends = rounds["start"] + rounds["duration"]
    for i, row in enumerate(rows):
        lo = -np.inf if i == 0 else rounds["start"][i]
        mine = ep["return"][(ep["time"] >= lo) & (ep["time"] < ends[i])]
        assert int(row["episodes"]) == len(mine)
        if len(mine):
            assert float(row["reward_mean"]) == pytest.approx(mine.mean(), rel=1e-5)
            assert float(row["reward_max"]) == pytest.approx(mine.max(), rel=1e-5)
        adm = grads["staleness"][(grads["round"] == rounds["round"][i]) & (grads["admitted"] == 1)]
        if len(adm):
            assert float(row["staleness_max"]) == adm.max() and float(row["staleness_min"]) == adm.min()
        assert float(row["duration"]) == pytest.approx(rounds["duration"][i], rel=1e-5)
        assert int(row["actors"]) == rounds["active_actors"][i]
        th = rounds["threshold"][i]
        assert (row["threshold"] == "") if np.isnan(th) else float(row["threshold"]) == pytest.approx(th, rel=1e-5)
        # Stellaris cost: duration x (active learner ranks x GPU price / 4 functions + actors x vCPU price)
        price = rounds["active_groups"][i] * 3.06 / 4 / 3600 + rounds["active_actors"][i] * 4.896 / 128 / 3600
        assert float(row["cost"]) == pytest.approx(rounds["duration"][i] * price, rel=1e-4)
    assert sum(int(r["episodes"]) for r in rows) == len(ep["time"])  # every episode lies inside a round here
    assert sum(float(r["learner_time"]) for r in rows) == pytest.approx(la["compute_seconds"].sum(), rel=1e-4)
    md = (tmp_path / "summary.md").read_text()
    assert f"| episodes | {len(ep['time'])} |" in md
    assert f"| gradients not admitted | {int((grads['admitted'] == 0).sum())} |" in md
    for name in ("learning_wallclock", "learning_envsteps", "staleness", "threshold", "gradients", "elasticity",
                 "cost", "latency"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    html = (tmp_path / "report.html").read_text()
    assert html.count("<img ") == 8 and html.count("data:image/png;base64,") == 8 and "src='figures" not in html


def test_cost_totals_and_editable_prices(runs, tmp_path):
    run = ha.load_run(runs["s0"])
    la, ac = read_table(runs["s0"], "learner_activity"), read_table(runs["s0"], "actors")
    c = M.cost(run, M.load_prices(None))
    assert c["learner_seconds"] == pytest.approx(la["compute_seconds"].sum(), rel=1e-5)
    assert c["serverless_learner"] == pytest.approx(c["learner_seconds"] * 3.06 / 4 / 3600, rel=1e-6)
    assert c["serverless_actor"] == pytest.approx(ac["sample_seconds"].sum() * 4.896 / 128 / 3600, rel=1e-5)
    assert c["serverful_learner"] == pytest.approx(c["wall_seconds"] * 2 * 3.06 / 3600, rel=1e-6)  # 2 learner ranks
    assert c["serverful_actor"] > c["serverless_actor"]
    custom = tmp_path / "p.json"
    custom.write_text(json.dumps({"currency": "node-hours", "learner": {"instance_per_hour": 6.12}}))
    c2 = M.cost(run, M.load_prices(custom))
    assert c2["serverless_learner"] == pytest.approx(2 * c["serverless_learner"])
    assert c2["serverless_actor"] == pytest.approx(c["serverless_actor"])
    shipped = json.loads((REPO / "analysis" / "prices.json").read_text())
    assert shipped == M.DEFAULT_PRICES, "analysis/prices.json must show the defaults"


@pytest.mark.slow
def test_two_settings_compare_with_mean_and_spread(compared):
    out = compared
    curve = M.curves_on_grid(out.runs[:2], "env_steps")
    both = curve["count"] == 2
    assert both.sum() > 100
    assert (curve["min"][both] <= curve["mean"][both] + 1e-9).all() and (curve["mean"][both] <= curve["max"][both] + 1e-9).all()
    assert (curve["max"][both] > curve["min"][both]).any()  # a real spread between seeds
    header = out.markdown.read_text().splitlines()[2]
    assert header.count("synth (stellaris)") == 2 and header.count("synth (pure_async)") == 1
    assert len(out.csv) == 3 and len({p.name for p in out.csv}) == 3


LIVE_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from synthetic_run import write_synthetic_run
    run = write_synthetic_run(Path(sys.argv[1]), "stellaris", seed=3, rounds=5, close=False)  # kept open
    print("flushed", flush=True)
    time.sleep(60)
""")


def test_live_then_killed_run(tmp_path):
    run_dir = tmp_path / "live"
    proc = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(run_dir), str(Path(__file__).parent)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().startswith("flushed")
        live = ha.analyze([run_dir], tmp_path / "live-out", figures=False)
        assert any("still running" in n for n in live.runs[0].notes)
        assert len(read_csv(live.csv[0])) == 5 and live.html is None and not live.figures
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = ha.load_run(run_dir)
        assert any("killed" in n for n in killed.notes)
        csv_path = ha.report.write_rounds_csv(killed, tmp_path / "killed.csv", M.load_prices(None))
        assert len(read_csv(csv_path)) == 5
        assert "| episodes |" in ha.report.markdown([killed], M.load_prices(None))
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_bad_inputs_give_one_line_and_exit_2(runs, tmp_path, capsys):
    data = (runs["a0"] / "run.h5").read_bytes()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "run.h5").write_bytes(data[: len(data) // 3])
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "run.h5").write_text("not hdf5")
    import h5py
    (tmp_path / "foreign").mkdir()
    with h5py.File(tmp_path / "foreign" / "run.h5", "w") as f:
        f["x"] = 1
    expected = {"cut": "truncated or not HDF5", "text": "truncated or not HDF5", "foreign": "not an hpcrl run file",
                "missing": "no such file"}
    for name, words in expected.items():
        assert hpcrl_main(["analyze", str(tmp_path / name), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err and str(tmp_path / name) in err and "Traceback" not in err, err


STANDALONE = textwrap.dedent("""
    import runpy, sys
    script, run_dir, out = sys.argv[1:4]
    sys.argv = ["analyze.py", run_dir, "--out", out, "--no-figures"]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        assert exc.code == 0, exc.code
    leaked = sorted(m for m in sys.modules if m == "hpcrl" or m.startswith("hpcrl."))
    assert not leaked, leaked
    print("ok")
""")


def test_standalone_folder_never_imports_hpcrl(runs, tmp_path):
    """A copy of analysis/ elsewhere works with h5py, numpy and matplotlib alone."""
    copy = tmp_path / "analysis"
    shutil.copytree(REPO / "analysis", copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", STANDALONE, str(copy / "analyze.py"), str(runs["a0"]), str(tmp_path / "o")],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]
    assert (tmp_path / "o" / "summary.md").is_file()
    for py in (REPO / "analysis").rglob("*.py"):
        assert not re.search(r"^\s*(from|import)\s+hpcrl\b", py.read_text(), re.M), py


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium not installed (apt-get install chromium)")
def test_html_report_renders_every_figure_in_headless_chromium(compared, tmp_path):
    page = compared.html.read_text()
    probe = ("<script>window.addEventListener('load', () => { const w = [...document.images].map(i => "
             "i.complete ? i.naturalWidth : 0); document.body.setAttribute('data-widths', w.join(',')); });</script>")
    (tmp_path / "probe.html").write_text(page.replace("</body>", probe + "</body>"))
    profile = tempfile.mkdtemp()
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", (tmp_path / "probe.html").as_uri()]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'data-widths="([^"]*)"', res.stdout)
    assert m, f"chromium produced no probe result: {res.stderr[-1500:]}"
    widths = [int(w) for w in m.group(1).split(",")]
    assert len(widths) == 8 and all(w > 300 for w in widths), widths


@pytest.mark.mpi
@pytest.mark.slow
def test_real_short_run_is_analysed_against_its_hdf5(tmp_path):
    """A real `hpcrl run` (CartPole, 4 ranks, a few hundred steps), then `hpcrl analyze` on it."""
    run_dir = tmp_path / "run"
    cfg = {"name": "real", "env": {"id": "CartPole-v1", "num_envs": 2}, "actors": {"count": 2, "fragment_length": 16},
           "learners": {"groups": 1, "ranks_per_group": 1},
           "algo": {"name": "ppo", "train_batch_size": 64, "minibatch_size": 32, "num_sgd_iter": 1},
           "stop": {"total_env_steps": 640}, "io": {"flush_seconds": 0.5, "run_dir": str(run_dir)},
           "launch": {"timeout_seconds": 120}}
    (tmp_path / "cfg.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(tmp_path / "cfg.yaml")], capture_output=True,
                         text=True, timeout=150, start_new_session=True)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    out = tmp_path / "out"
    assert hpcrl_main(["analyze", str(run_dir), "--out", str(out)]) == 0
    rounds, ep, grads = (read_table(run_dir, t) for t in ("rounds", "episodes", "gradients"))
    rows = read_csv(next(out.glob("rounds-*.csv")))
    assert len(rows) == len(rounds["round"]) > 0
    last_end = (rounds["start"] + rounds["duration"]).max()
    assert sum(int(r["episodes"]) for r in rows) == int((ep["time"] < last_end).sum())
    md = (out / "summary.md").read_text()
    assert f"| episodes | {len(ep['time'])} |" in md
    assert f"| gradients admitted | {int((grads['admitted'] == 1).sum())} |" in md
    assert len(list(out.glob("*.png"))) == 8 and (out / "report.html").read_text().count("data:image/png;base64,") == 8


@pytest.mark.slow
def test_sparse_run_of_the_batched_runner(tmp_path):
    """Only episodes, updates and rounds (the single-process HA2C/HDDPG runner): every output still made."""
    from hpcrl.io import RunFile
    with RunFile.create(tmp_path / "run.h5", "name: batched\n", {"rank": [0], "role": [0]}) as run:
        t = np.arange(1.0, 11.0)
        run.append("episodes", {"time": t, "actor": 0, "env_index": np.arange(10) % 4, "return": t * 10,
                                "length": 50, "env_steps": (t * 400).astype(int)})
        run.append("updates", {"time": t, "version": np.arange(1, 11), "round": np.arange(10) // 5,
                               "num_gradients": 1, "loss_mean": 1 / t})
        run.append("rounds", {"round": [0, 1], "start": [0.0, 5.5], "duration": [5.5, 5.0], "episodes": [5, 5]})
    out = ha.analyze([tmp_path], tmp_path / "out")
    rows = read_csv(out.csv[0])
    assert [int(r["episodes"]) for r in rows] == [5, 5] and [float(r["reward_max"]) for r in rows] == [50.0, 100.0]
    assert len(out.figures) == 8 and all(p.stat().st_size > 5_000 for p in out.figures.values())
    assert "| episodes | 10 |" in out.markdown.read_text()


def test_complete_only_when_no_table_holds_unwritten_rows(runs, tmp_path):
    from hpcrl.io.schema import TABLES
    import h5py

    assert ha.h5read.REQUIRED == {n: tuple(c.name for c in t.columns if c.required) for n, t in TABLES.items()}
    prices = M.load_prices(None)
    assert M.summary(ha.load_run(runs["s0"]), prices)["status"] == "complete tables"
    episodes = len(read_table(runs["s0"], "episodes")["time"])
    for case in ("cut_short", "no_attribute"):
        run_dir = tmp_path / case
        shutil.copytree(runs["s0"], run_dir)
        with h5py.File(run_dir / "run.h5", "a", locking=False) as f:  # a flush cut short: 5 rows of fill values
            for c in f["episodes"]:
                f["episodes"][c].resize(episodes + 5, axis=0)
            if case == "no_attribute":  # as in files from before committed_rows
                del f["episodes"].attrs["committed_rows"]
        run = ha.load_run(run_dir)
        status = M.summary(run, prices)["status"]
        assert status != "complete tables" and "table 'episodes'" in status, status
        assert run.rows("episodes") == episodes and np.isfinite(run.table("episodes")["time"]).all()


def test_runs_of_different_runners_are_not_repeats_and_the_comparison_lands_beside_them(runs, tmp_path, monkeypatch):
    cli = sys.modules[ha.analyze.__module__]
    loaded = [ha.load_run(runs["s0"]), ha.load_run(runs["s1"])]
    loaded[0].attrs["runner"], loaded[1].attrs["runner"] = "mpi", "serial"
    cli._label_runners(loaded)
    assert [r.label for r in loaded] == ["synth (stellaris) [mpi]", "synth (stellaris) [serial]"]
    same = [ha.load_run(runs["s0"]), ha.load_run(runs["s1"])]
    cli._label_runners(same)  # one runner (or none recorded): repeats, labels unchanged
    assert [r.label for r in same] == ["synth (stellaris)"] * 2
    monkeypatch.chdir(tmp_path)  # the comparison is written beside the runs, not into the current folder
    out = ha.analyze([runs["s0"], runs["s1"]], figures=False)
    assert out.out_dir == runs["s0"].parent / "analysis-compare" and not (tmp_path / "analysis-compare").exists()
