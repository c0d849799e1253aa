"""What a node's report relay sends rank 0 for a batch of its actors' reports (``actors.reports: node`` or
``summary``), apart from how the batch travels (``node_reports.py`` over MPI, ``local_node_reports.py`` in one
process), so both relays take either."""
from __future__ import annotations

from typing import Protocol

from hpcrl.runtime.messages import NodeReports, Report

FLUSH_SECONDS = 0.05
"""The longest a report waits in a node's relay (while the relay's loop runs): the relays of both runners."""


class Packing(Protocol):
    """How a relay's batch of reports becomes its one message to rank 0."""

    every_actor: bool
    """Send as soon as every open actor of the node has a message in the batch (else only every flush_seconds)."""

    def pack(self, relay: int, batch: list[Report]) -> Report: ...
    def close(self) -> None: ...


class ReportColumns:
    """``actors.reports: node``: the batch's fragment reports as columns, its other messages as they are."""

    every_actor = True

    def pack(self, relay: int, batch: list[Report]) -> Report:
        return NodeReports.of(relay, batch)

    def close(self) -> None:
        """Nothing is held."""
