"""Which of a local job's rank processes ended first, from the kernel (``pidfd_open``), for the launcher's last line.

MPICH hydra's banner names one PID, but once a rank dies it kills the others and then reports the lowest rank
that ended badly (all of them did, with SIGKILL): a rank killed while the job starts (before the prestart server
forked it, so no stand-in line names it) was blamed on rank 0. :class:`ExitOrder` waits on a pidfd per rank
process in a thread and keeps the rank whose process ended alone first; when two end within one wake-up it
names none (the banner is then all there is).
"""
from __future__ import annotations

import os
import selectors
import threading


class ExitOrder:
    """``watch({pid: rank})`` as the ranks are found; ``first`` is the rank that ended first, or None."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.ambiguous = False
        self._sel = selectors.DefaultSelector() if hasattr(os, "pidfd_open") else None
        self._watched: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._wait, name="rank-exits", daemon=True)
        if self._sel is not None:
            self._wake_r, self._wake_w = os.pipe()  # stop() writes one byte: the thread's select returns at once
            self._sel.register(self._wake_r, selectors.EVENT_READ, None)
            self._thread.start()

    def watch(self, pids: dict[int, int]) -> None:
        """Wait on the processes of ``pids`` (PID -> rank) not watched yet; one already gone is left out."""
        if self._sel is None:
            return
        for pid, rank in pids.items():
            if pid in self._watched:
                continue
            self._watched.add(pid)
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # gone already, or not ours to watch
                continue
            self._sel.register(fd, selectors.EVENT_READ, rank)

    def _wait(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select()
            except (OSError, ValueError):  # closed by stop()
                return
            if any(key.data is None for key, _ in events):  # woken by stop()
                return
            if events and self.first is None and not self.ambiguous:
                ranks = sorted({key.data for key, _ in events})
                if len(ranks) == 1:
                    self.first = ranks[0]
                else:
                    self.ambiguous = True
            for key, _ in events:
                self._sel.unregister(key.fileobj)
                os.close(key.fileobj)

    def stop(self) -> None:
        """End the thread and close every pidfd (once: a second call does nothing)."""
        if self._sel is None or self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(1.0)
        for key in list(self._sel.get_map().values()):
            try:
                os.close(key.fileobj)
            except OSError:
                pass
        os.close(self._wake_w)
        self._sel.close()
