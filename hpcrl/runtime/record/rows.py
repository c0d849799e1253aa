"""Rows of run.h5 kept on the parameter rank and handed to the file a table at a time.

``RunFile.append`` of one row costs about as much as of a hundred (per-column conversion and
checks: measured 0.1 to 0.4 ms a row, 9 us a row in a batch of 2,000). The parameter rank
writes two to four rows per gradient (gradients, updates, actors, episodes), so it keeps them
here and calls :meth:`RowBuffer.flush` every half second, before a checkpoint counts the
rows, and before the file closes. Rows that come as columns (a node's fragment reports, ``actors.reports:
node``) are kept as one block and appended as they are, in their place among the table's rows.
"""
from __future__ import annotations

import itertools

import numpy as np


class Columns(dict):
    """A block of rows as columns (name -> 1-D array, one length)."""


class RowBuffer:
    def __init__(self, run_file) -> None:
        self.run_file = run_file
        self.pending: dict[str, list[dict]] = {}

    def add(self, table: str, row: dict) -> None:
        self.pending.setdefault(table, []).append(row)

    def add_columns(self, table: str, columns: dict) -> None:
        self.pending.setdefault(table, []).append(Columns(columns))

    def flush(self) -> None:
        """Append every kept row to the run file, in order (rows of one table share one set of columns; a run of
        blocks of columns is one append too)."""
        pending, self.pending = self.pending, {}
        for table, rows in pending.items():
            start = 0
            for i in range(1, len(rows) + 1):  # runs of rows with the same columns, one append each
                if (i == len(rows) or rows[i].keys() != rows[start].keys()
                        or (type(rows[i]) is Columns) != (type(rows[start]) is Columns)):
                    run = rows[start:i]
                    self.run_file.append(table, _joined(run) if type(run[0]) is Columns else run)
                    start = i


def _joined(blocks: list[Columns]) -> dict:
    """Blocks of columns (the same names) as one: each column's values in block order (lists joined as lists,
    made an array once by the table, as rows are)."""
    if len(blocks) == 1:
        return blocks[0]
    out = {}
    for k in blocks[0]:
        parts = [b[k] for b in blocks]
        out[k] = (list(itertools.chain.from_iterable(parts)) if all(type(p) is list for p in parts)
                  else np.concatenate([np.atleast_1d(np.asarray(p)) for p in parts]))
    return out
