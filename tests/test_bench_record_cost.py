"""hpcrl bench record-cost: rank 0's record of a node's reports, marginal CPU per report; bad input in one line."""
import pytest

from hpcrl.bench import record_cost


def test_the_marginal_cost_is_measured_per_block_size():
    got = record_cost.measure([4, 16], 6400)  # 640 reports cost about a millisecond: less than one flush
    assert sorted(got) == [4, 16] and all(0 < us < 1e4 for us in got.values()), got


@pytest.mark.parametrize("args, says", [
    (["--against", "HEAD", "--blocks", "8,x"], "--blocks '8,x': give whole numbers"),
    (["--against", "HEAD", "--blocks", "64", "--reports", "100"], "--reports >= 20 x the largest block"),
    (["--against", "no-such-rev"], "--against 'no-such-rev' is not a revision"),
])
def test_bad_input_is_one_line(args, says):
    with pytest.raises(SystemExit) as exc:
        record_cost.main(args)
    assert says in str(exc.value) and len(str(exc.value).splitlines()) == 1
