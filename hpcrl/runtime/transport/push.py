"""The one gradient push loop, shared by the RMA mailbox and the serial runner's in-memory twin."""
from __future__ import annotations

from typing import Callable

import numpy as np

from hpcrl.runtime.backoff import Backoff


class PushAbandoned(RuntimeError):
    """``push`` gave up (timeout reached or ``abandon()`` returned True)."""


class PushLoop:
    """Mixin: :meth:`push` retries the subclass's ``try_push`` with back-off (and counts the wait)."""

    total_wait = 0.0

    def try_push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray,
                 stats=None) -> bool:
        raise NotImplementedError

    def push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray, stats=None,
             timeout: float | None = None, abandon: Callable[[], bool] | None = None,
             backoff: Backoff | None = None) -> float:
        """Put ``grad`` into a free slot of ``group``; wait (backing off) while all are busy.

        ``stats``: the float64 stats vector, or a function of the seconds waited so far that
        returns it (so the wait itself travels with the gradient). Returns the seconds spent
        waiting for a slot (0.0 when one was free at once). Raises :class:`PushAbandoned` after
        ``timeout`` seconds or when ``abandon()`` returns True.
        """
        backoff = backoff or Backoff()
        clock = backoff.clock  # the role's (virtual under launch.runner=sim)
        start = clock.now()
        while True:
            waited = clock.now() - start if backoff.waited else 0.0
            vec = stats(waited) if callable(stats) else stats
            if self.try_push(group, seq, base_version, samples, grad, vec):
                break
            if abandon is not None and abandon():
                raise PushAbandoned(f"group {group} push of seq {seq} abandoned")
            if timeout is not None and clock.now() - start > timeout:
                raise PushAbandoned(f"group {group} push of seq {seq}: no free slot within {timeout} s")
            self._nap(group, backoff)
        self.total_wait += waited
        return waited

    def _nap(self, group: int, backoff: Backoff) -> None:
        """One wait between two tries for a slot of ``group`` (the virtual-time twin skips the naps in which
        nothing the pushing learner sees can change)."""
        backoff.sleep()
