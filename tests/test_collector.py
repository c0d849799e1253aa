"""runtime/collector.py: an entry point's pause stops collection until resume makes the start-up's objects
permanent; resume does nothing in a process whose collector nobody paused (a program calling hpcrl itself)."""
from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import gc
from hpcrl.runtime import collector

collector.resume()  # nobody paused: nothing changes
assert gc.isenabled() and gc.get_freeze_count() == 0
collector.pause()
assert not gc.isenabled()
kept = [[i] for i in range(1000)]  # the start-up's objects
collector.resume()
assert gc.isenabled() and gc.get_freeze_count() >= 1000, gc.get_freeze_count()
collector.resume()  # once only
print("ok")
"""


def test_pause_then_resume_freezes_the_start_up_and_collects_again():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
