"""Rank 0's handling of the actors' fragment reports, in each of the forms ``actors.reports`` sends them.

Whatever the form, a fragment feeds the elastic rule (the actor's sampling rate), the actor ledger (its next fragment
number and newest normalisation statistics, for checkpoints) and the record (rows, the round's statistics):

- ``fragment``: one :class:`~hpcrl.runtime.messages.FragmentReport` per fragment, recorded row by row;
- ``node``: a node's reports as columns (:class:`~hpcrl.runtime.messages.NodeReports`), recorded as one block;
- ``summary``: a node's sums (:class:`~hpcrl.runtime.messages.NodeSummary`): the rows are in the node's file, and
  the rule and the ledger are told once per actor and message (the rule's rate is the actor's steps over its
  sampling seconds in the message: its exponential average moves once per message, not per fragment).

A node message's other reports (parks, joins, evaluations) go to their own handlers (``dispatch``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hpcrl.runtime.messages import FragmentReport, NodeReports, NodeSummary, Report
from hpcrl.runtime.record.run_record import RunRecord
from hpcrl.runtime.roles.actor_ledger import ActorLedger


class FragmentHandlers:
    """``groups``: rank 0's active groups (``groups.rule``: the elastic rule); ``env_steps``: reads the run's env-step
    counter (an episode's row holds it)."""

    def __init__(self, groups, ledger: ActorLedger, record: RunRecord, env_steps: Callable[[], int],
                 dispatch: Callable[[Report], None]) -> None:
        self.groups, self.ledger, self.record = groups, ledger, record
        self.env_steps, self.dispatch = env_steps, dispatch

    def fragment(self, report: FragmentReport) -> None:
        self.groups.rule.fragment(report.actor, report.steps, report.sample_seconds)
        self.ledger.fragment(report.actor, report.fragment, report.normalizer)
        self.record.fragment(report, self.env_steps() if report.episodes else 0)

    def node(self, node: NodeReports) -> None:
        """A node's reports: its fragment reports as one block (what :meth:`fragment` does with each, the run's env
        steps read once), then each other message."""
        f = node.fragments
        actors = f.actors
        rule, ledger = self.groups.rule, self.ledger
        for a, fragment, steps, seconds in zip(actors["actor"], actors["fragment"], actors["steps"],
                                               actors["sample_seconds"]):
            rule.fragment(a, steps, seconds)
            ledger.fragment(a, fragment, f.normalizers.get(a))
        if len(f):
            self.record.fragments(actors, f.episodes, self.env_steps() if len(f.episodes["actor"]) else 0)
        for message in node.reports:
            self.dispatch(message)

    def summary(self, node: NodeSummary) -> None:
        """A node's sums: the rule and the ledger per actor, the round's statistics, then each other message."""
        rule, ledger = self.groups.rule, self.ledger
        actors, newest = (node.actor_sum(c).astype(np.int64).tolist() for c in ("actor", "newest_fragment"))
        for a, n, steps, seconds in zip(actors, newest, node.actor_sum("steps").tolist(),
                                        node.actor_sum("sample_seconds").tolist()):
            rule.fragment(a, steps, seconds)
            ledger.fragment(a, n, node.normalizers.get(a))
        self.record.node_summary(node)
        for message in node.reports:
            self.dispatch(message)
