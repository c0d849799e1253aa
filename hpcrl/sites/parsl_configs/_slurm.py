"""A SlurmProvider whose constructor does not call the scheduler."""
from __future__ import annotations

from parsl.providers import SlurmProvider
from parsl.providers.slurm.slurm import sacct_translate_table


class DeferredSlurmProvider(SlurmProvider):
    """Parsl's SlurmProvider runs ``sacct -X`` in ``__init__`` to choose sacct or squeue for job status.

    Here that probe is answered "no" during construction (so building a config touches nothing)
    and asked for real on the first status poll, after which sacct is used where accounting exists.
    """

    def __init__(self, *args, **kwargs):
        self._probe_done = False
        super().__init__(*args, **kwargs)

    def execute_wait(self, cmd, timeout=None):
        if not self._probe_done and cmd.startswith("sacct -X") and "--format" not in cmd:
            return 1, "", "sacct probe deferred until the first status poll"
        return super().execute_wait(cmd, timeout)

    def _status(self):
        if not self._probe_done:
            self._probe_done = True
            retcode, _, _ = self.execute_wait("sacct -X")
            if retcode == 0:  # accounting works: it also reports jobs that have left the queue
                clusters = f" --clusters={self.clusters}" if self.clusters else ""
                self._cmd = f"sacct{clusters} -X --noheader --format=jobid,state%20 --job '{{0}}'"
                self._translate_table = sacct_translate_table
        return super()._status()
