"""Rank 0's memory of each actor, from its fragment reports: the number of its next fragment and its newest
normalisation statistics. Both go into every checkpoint and, through ``Startup``, back to the actors of a resumed
job, which go on numbering and normalising from them."""
from __future__ import annotations

from typing import Any


class ActorLedger:
    def __init__(self, actors: int) -> None:
        self.fragment_next = [0] * actors
        self.normalizers: list[dict | None] = [None] * actors

    def fragment(self, actor: int, fragment: int, normalizer: dict | None) -> None:
        """Actor ``actor`` reported fragment number ``fragment`` (with its statistics, or None: unchanged)."""
        self.fragment_next[actor] = max(self.fragment_next[actor], fragment + 1)
        if normalizer is not None:
            self.normalizers[actor] = normalizer

    def state(self) -> dict[str, Any]:
        return {"fragment_next": list(self.fragment_next), "normalizers": list(self.normalizers)}

    def restore(self, saved: dict[str, Any], actors: int) -> None:
        """A checkpoint's ledger for a job of ``actors`` actors: an actor the resume adds starts at fragment 0 and
        from another actor's statistics; numbers of actors a smaller job leaves out are kept."""
        kept = list(saved.get("fragment_next", []))
        self.fragment_next = kept + [0] * max(actors - len(kept), 0)
        stats = list(saved.get("normalizers", []))[:actors]
        self.normalizers = [stats[i] if i < len(stats) else stats[i % len(stats)] if stats else None
                            for i in range(actors)]
