"""MARLess pricing (analysis/hpcrl_analysis/pricing.py, `hpcrl analyze --pricing marless`): the arithmetic on a
hand-made run record, worked out by hand below, and the price table's one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpcrl.cli import main as hpcrl_main
from hpcrl.commands.analyze import load_analysis
from hpcrl.io import RunFile

ha = load_analysis()
P = ha.pricing

TABLE = {"gb_second": 0.001, "request": 0.01, "memory_gb": {"learner": 2.0, "actor": 1.0, "parameter": 1.0},
         "serverful": {"instance": "box", "instance_per_hour": 3.6, "vcpus": 4}}
"""Round numbers so that every cost below is worked out by hand."""


@pytest.fixture
def run_dir(tmp_path):
    """1 parameter rank, 2 learner groups of 1 rank, 3 actors; startup 2 s; 4 learner stretches of 1.5 s,
    5 fragments of 2 s, 3 updates of 0.25 + 0.25 s; the last row at 100 s."""
    rank_map = {"rank": np.arange(6), "role": [0, 1, 1, 2, 2, 2], "group": [-1, 0, 1, -1, -1, -1],
                "index": [0, 0, 0, 0, 1, 2]}
    with RunFile.create(tmp_path / "run.h5", "name: hand-made\n", rank_map, attrs={"startup_seconds": 2.0}) as run:
        run.append("learner_activity", {"time_start": [1.0, 2.0, 3.0, 4.0], "time_end": [2.5, 3.5, 4.5, 5.5],
                                        "group": [0, 1, 0, 1], "compute_seconds": 1.5, "samples": 100})
        run.append("actors", {"time": [1.0, 2.0, 3.0, 4.0, 5.0], "actor": [0, 1, 2, 0, 1],
                              "fragment": [0, 0, 0, 1, 1], "steps": 64, "sample_seconds": 2.0})
        run.append("updates", {"time": [10.0, 50.0, 100.0], "version": [1, 2, 3], "round": [0, 0, 1],
                               "num_gradients": 1, "aggregate_seconds": 0.25, "publish_seconds": 0.25})
    return tmp_path


def test_marless_cost_by_hand(run_dir, tmp_path):
    prices = P.load_marless_prices(None)
    prices.update({k: v for k, v in TABLE.items() if k != "memory_gb" and k != "serverful"})
    prices["memory_gb"].update(TABLE["memory_gb"])
    prices["serverful"].update(TABLE["serverful"])
    c = P.marless_cost(ha.load_run(run_dir), prices)
    # learner: 6 active s x 2 GB x 0.001 + 2 functions x (2 s x 2 GB x 0.001 + 0.01) pre-warm + 4 requests x 0.01
    assert c["serverless_learner"] == pytest.approx(0.012 + 0.028 + 0.04)
    assert c["prewarm_learner"] == pytest.approx(0.028) and c["requests_learner"] == 6
    # actor: 10 s x 1 GB x 0.001 + 3 x (2 x 1 x 0.001 + 0.01) + 5 x 0.01
    assert c["serverless_actor"] == pytest.approx(0.010 + 0.036 + 0.05)
    # parameter: 1.5 s x 1 GB x 0.001 + 1 x (0.002 + 0.01) + 3 x 0.01
    assert c["serverless_parameter"] == pytest.approx(0.0015 + 0.012 + 0.03)
    assert c["serverless"] == pytest.approx(0.2195)
    # vCPUs: 2 x 2/1.769 + 3 x 1/1.769 + 1/1.769 = 4.52 > 4: two instances, 100 s at 3.6/h each
    assert c["instances"] == 2 and c["serverful"] == pytest.approx(0.2)
    assert c["serverless_over_serverful"] == pytest.approx(0.2195 / 0.2)
    assert c["serverful_over_serverless"] == pytest.approx(0.2 / 0.2195)


def test_default_table_is_lambda_and_c6a_16xlarge():
    p = P.load_marless_prices(None)
    assert p["gb_second"] == 0.0000166667 and p["request"] == pytest.approx(0.20 / 1e6)
    assert p["serverful"] == {"instance": "c6a.16xlarge", "instance_per_hour": 2.448, "vcpus": 64}
    shipped = json.loads((Path(ha.__file__).parents[1] / "prices-marless.json").read_text())
    assert shipped == p  # the JSON next to analyze.py is the default table


def test_hpcrl_analyze_pricing_marless_writes_both_ratios(run_dir, tmp_path, capsys):
    table = tmp_path / "t.json"
    table.write_text(json.dumps(TABLE))
    assert hpcrl_main(["analyze", str(run_dir), "--no-figures", "--out", str(tmp_path / "a"), "--pricing", "marless",
                       "--marless-prices", str(table)]) == 0
    md = (tmp_path / "a" / "summary.md").read_text()
    assert "## MARLess pricing: AWS Lambda functions vs box" in md
    assert "| 0.08 | 0.096 | 0.0435 | 0.076 | 0.2195 | 0.2 | 2 | 1.097 | 0.911 |" in md
    assert hpcrl_main(["analyze", str(run_dir), "--no-figures", "--out", str(tmp_path / "b")]) == 0
    assert "MARLess pricing" not in (tmp_path / "b" / "summary.md").read_text()  # stellaris: as before


def test_bad_marless_table_is_one_line(run_dir, tmp_path, capsys):
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"gb_secnd": 1}))
    assert hpcrl_main(["analyze", str(run_dir), "--no-figures", "--out", str(tmp_path / "a"), "--pricing", "marless",
                       "--marless-prices", str(table)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key 'gb_secnd'" in err[0]
