"""hpcrl bench hot-paths: the old side is the revision's own modules, beside this checkout's, timed in turns."""
import subprocess
from pathlib import Path

import pytest

from hpcrl.bench import hot_paths

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def head() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return done.stdout.strip()


def test_old_module_is_the_revisions_file_as_a_module_of_its_own(head):
    import hpcrl.models

    old = hot_paths.old_module(head, "hpcrl/models.py", "hpcrl_at_test_models")
    assert old is not hpcrl.models and old.ActorCritic is not hpcrl.models.ActorCritic
    assert old.__file__ == f"{head}:hpcrl/models.py"
    assert old.ActorCritic.__module__ == "hpcrl_at_test_models"  # its classes are its own, not the checkout's


def test_hot_paths_time_both_sides_of_every_part(head):
    res = hot_paths.measure(str(ROOT / "hpcrl" / "configs" / "hopper.yaml"), head, rounds=2)
    assert list(res) == ["policy act (an actor's batch)", "sampler, per env step (env included)",
                         "observation normalisation", "minibatch gradient"]
    assert all(o > 0 and n > 0 for o, n in res.values())
