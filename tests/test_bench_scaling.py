"""The scaling and start-up benchmarks' readings of a record (a synthetic run.h5; the runs are in hpcrl bench)."""
from hpcrl.bench.scaling import print_table, record_rates
from hpcrl.io import read_attrs, read_table
from hpcrl.runtime.runners.startup import first_step_unix
from synthetic_run import write_synthetic_run


def test_rates_from_a_record_and_the_efficiency_table(tmp_path, capsys):
    write_synthetic_run(tmp_path / "r", actors=3, groups=2)
    h5 = tmp_path / "r" / "run.h5"
    r = record_rates(h5, actors=3)
    frags = read_table(h5, "actors", ["steps", "time"])
    assert r["env_steps"] == int(frags["steps"].sum()) and r["steps_per_s"] > 0
    assert 0 < r["busy"] <= 1 and r["grads"] == len(read_table(h5, "gradients", ["time"])["time"])
    cycles = read_table(h5, "learner_cycles", ["cycle_seconds", "gradient_seconds"])
    assert abs(r["cycle_ms"]["cycle"] - 1e3 * cycles["cycle_seconds"].mean()) < 1e-6
    assert abs(r["cycle_ms"]["gradient"] - 1e3 * cycles["gradient_seconds"].mean()) < 1e-6
    load = read_table(h5, "parameter_load", ["gradients", "apply_seconds"])
    assert abs(r["parameter_ms"]["apply"] - 1e3 * load["apply_seconds"].sum() / load["gradients"].sum()) < 1e-6
    one = {"actors": 1, "groups": 1, "wall": 1.0, **r}
    two = {**one, "actors": 2, "steps_per_s": 1.5 * r["steps_per_s"]}
    ceiling = {"env_id": "CartPole-v1", "num_envs": 8, "single": 1e4, "backend": 1e4}
    print_table("cartpole", ceiling, [one, two], cores=2, steps=1000)
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert rows[0][4] == "1.00" and rows[1][4] == "0.75"  # 1.5x the rate on 2 actors: 75 % efficiency
    assert "oversubscribed (4 ranks on 2 cores)" in " ".join(rows[1])


def test_first_step_is_the_earliest_fragment_start_after_the_command(tmp_path):
    write_synthetic_run(tmp_path / "r", actors=2)
    h5 = tmp_path / "r" / "run.h5"
    start = float(read_attrs(h5)["start_unix"])
    frags = read_table(h5, "actors", ["time"])
    first = first_step_unix(h5)
    assert first < start + frags["time"].min()  # before the first fragment was handed over
    later = first_step_unix(h5, after=start + frags["time"].max())  # only the last fragment counts
    assert later > first
    assert first_step_unix(h5, after=start + frags["time"].max() + 1) is None
