"""Whether a choice made on held-out queries lies at an edge of its grid (docs/selection.md).

A chosen value that is its setting's largest (or smallest) in the grid leaves open whether a
larger (smaller) one would do better still: the grid did not bracket the best. Stage
``select_settings`` logs a warning, and the comparison's held-out section names the edge.

Apart from :mod:`.selection` on purpose: every retriever's training imports that module, and
its code's hash is part of each stored model's key (docs/resuming.md); a change to this report
must retrain nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any


def grid_edges(grid: Sequence[Mapping[str, Any]], chosen: Mapping[str, Any]) -> dict[str, str]:
    """``{setting: "highest" | "lowest"}`` for each numeric setting that takes at least two
    values across the ``grid``'s points (dicts of settings) and whose ``chosen`` value is the
    largest or the smallest of them. Booleans, strings and nulls are not ordered: never an edge."""
    edges: dict[str, str] = {}
    for key, value in chosen.items():
        if not _ordered(value):
            continue
        values = {point[key] for point in grid if key in point and _ordered(point[key])}
        if len(values) < 2:
            continue
        if value == max(values):
            edges[key] = "highest"
        elif value == min(values):
            edges[key] = "lowest"
    return edges


def describe(edges: Mapping[str, str]) -> str:
    """``"at the grid's highest learning_rate"`` (settings joined by "and"); "" for none."""
    if not edges:
        return ""
    return "at the grid's " + " and ".join(f"{side} {key}" for key, side in edges.items())


def _ordered(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and value == value  # not NaN
