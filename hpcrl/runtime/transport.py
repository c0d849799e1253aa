"""The role loops' view of fragment transport: :mod:`hpcrl.runtime.channels` plus back-pressure.

:func:`fragment_layout` fixes the packed layout every actor and learner root agrees on (the
channel's standard fields plus ``last_obs``, which the learner uses to recompute the
bootstrap value with the newest weights). The actor asks :meth:`ActorLink.can_send` before
sampling the next send (``max_in_flight`` unmatched synchronous sends at most), and
:meth:`ActorLink.close` ends with the channel's stop convention, so a learner root knows
when every actor is done (:meth:`LearnerLink.finished`).
"""
from __future__ import annotations

import numpy as np

from hpcrl.runtime.channels import FragmentLayout, FragmentReceiver, FragmentSender


def fragment_layout(cfg, obs_shape: tuple, action_shape: tuple, discrete: bool) -> FragmentLayout:
    N = cfg.env.num_envs
    return FragmentLayout(cfg.actors.fragment_length, N, obs_shape=obs_shape, obs_dtype=np.float32,
                          action_shape=action_shape, action_dtype=np.int64 if discrete else np.float32,
                          extra={"last_obs": ((N, *obs_shape), np.float32)})


class ActorLink:
    def __init__(self, comm, layout: FragmentLayout, max_in_flight: int, dests: list[int]):
        self.sender = FragmentSender(comm, layout, max_in_flight)
        self.max_in_flight = max_in_flight
        self.dests = dests

    def can_send(self) -> bool:
        return self.sender.in_flight < self.max_in_flight

    def send(self, dest: int, fragment: dict) -> float:
        return self.sender.send(dest, fragment)

    def close(self) -> None:
        """Wait for every send to be taken, then tell each learner root how many it got."""
        self.sender.close(self.dests)


class LearnerLink:
    def __init__(self, comm, layout: FragmentLayout, sources: list[int]):
        self.receiver = FragmentReceiver(comm, layout, prepost=2)
        self.sources = sources

    def poll(self) -> list[dict]:
        """Every fragment that has arrived (possibly none)."""
        out = []
        while (f := self.receiver.poll()) is not None:
            out.append(f)
        return out

    def finished(self) -> bool:
        return self.receiver.finished(self.sources)

    def close(self) -> None:
        self.receiver.close()
