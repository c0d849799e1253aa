"""What a node's report relay sends rank 0 for a batch of its actors' reports (``actors.reports: node`` or
``summary``), apart from how the batch travels (``node_reports.py`` over MPI, ``local_node_reports.py`` in one
process), so both relays take either."""
from __future__ import annotations

from typing import Protocol

from hpcrl.runtime.messages import NodeReports, Report

FLUSH_SECONDS = 0.05
"""The longest a report waits in a node's relay (while the relay's loop runs): the relays of both runners."""
SUMMARIES_PER_SECOND = 2000
"""The most node summaries rank 0 is sent a second (``actors.reports: summary``): at about 0.1 ms each, a fifth of its
core. Past 100 nodes of actors each relay sends less often than every FLUSH_SECONDS (:func:`summary_interval`)."""


def summary_interval(relays: int) -> float:
    """Seconds between a relay's summaries when ``relays`` nodes send them: FLUSH_SECONDS, or longer so that rank 0
    gets at most SUMMARIES_PER_SECOND."""
    return max(FLUSH_SECONDS, relays / SUMMARIES_PER_SECOND)


class Packing(Protocol):
    """How a relay's batch of reports becomes its one message to rank 0."""

    every_actor: bool
    """Send as soon as every open actor of the node has a message in the batch (else only every flush_seconds)."""
    flush_seconds: float
    """The longest a report waits in the relay (while the relay's loop runs)."""

    def pack(self, relay: int, batch: list[Report]) -> Report: ...
    def close(self) -> None: ...


def due(packing: Packing, open_actors: set, senders: set, waited: float) -> bool:
    """Whether a relay's non-empty batch goes to rank 0 now: every open actor of the node has a message in it (for a
    packing that waits for them), or its oldest report has waited ``packing.flush_seconds``."""
    return (packing.every_actor and open_actors <= senders) or waited >= packing.flush_seconds


class ReportColumns:
    """``actors.reports: node``: the batch's fragment reports as columns, its other messages as they are."""

    every_actor = True
    flush_seconds = FLUSH_SECONDS

    def pack(self, relay: int, batch: list[Report]) -> Report:
        return NodeReports.of(relay, batch)

    def close(self) -> None:
        """Nothing is held."""
