"""hpcrl bench step-cost on CartPole with a tiny budget: every part of issue 42 is present and they add up."""
from hpcrl.bench import step_cost


def test_step_cost_parts_cover_the_measured_cpu():
    res = step_cost.measure(None, 256, ["env.num_envs=2", "algo.train_batch_size=64",
                                        "algo.minibatch_size=64", "algo.num_sgd_iter=2", "io.loggers=[]"])
    parts = res["parts_us"]
    assert list(parts) == list(step_cost.PARTS)
    assert all(v >= 0.0 for v in parts.values())
    # the profiled role loops cannot claim more CPU than the process spent (no part counted twice), 5 % slack
    assert res["profiled_us"] <= 1.05 * res["process_cpu_us"]
    assert abs(res["total_us"] - res["process_cpu_us"]) <= 0.05 * res["process_cpu_us"]
    for part in ("env step", "policy forward", "action sampling", "fragment and record writes",
                 "learner update", "parameter apply and publish"):
        assert parts[part] > 0.0, part
    assert res["env_alone_us"] > 0.0 and res["plain_torch_update_us"] > 0.0
    assert res["hpcrl_over_env_alone"] > 1.0
    # TensorBoard is off here: its row stays, at 0, with a note saying why
    assert parts["TensorBoard"] == 0.0 and "TensorBoard" in res["notes"]
    text = step_cost.table(res)
    for part in step_cost.PARTS:
        assert part in text


def test_against_table_gives_old_over_new_per_part():
    """--against's table: both sides' medians per part and old / new (a part at 0 on the new side shows '-')."""
    def side(scale: float, forward: float) -> dict:
        parts = {k: scale for k in step_cost.PARTS}
        parts["policy forward"] = forward
        return {"env_id": "X-v0", "env_steps": 8, "parts_us": parts, "loop_us": 10 * scale,
                "env_alone_us": 1.0, "plain_torch_update_us": 2.0}

    ab = {"rev": "abc123", "old": side(3.0, 6.0), "new": side(1.5, 0.0), "runs": {"old": [{}], "new": [{}]}}
    lines = step_cost.ratio_table(ab).splitlines()
    row = {line[:30].strip(): line[30:].split() for line in lines[2:]}
    assert row["env step"] == ["3.0", "1.5", "2.00"]
    assert row["policy forward"] == ["6.0", "0.0", "-"]
    assert row["per step without setup"] == ["30.0", "15.0", "2.00"]
    assert row["limit: env alone"][-1] == "1.00"
    assert "old = abc123" in lines[0]
