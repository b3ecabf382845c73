"""Settings chosen inside the workflow on held-out training queries.

The selection (``finetune.select``, docs/selection.md) never reads a test query:

1. :func:`heldout_ids` splits the judged training queries, in a seeded order, into a *fit* part
   and a *held-out* part (a share of them, at most a count: Bruch et al. 2023, section 6, find a
   fusion weight converging with under 5% of the training queries);
2. every point of a grid over ``finetune.retriever``'s settings (:func:`grid_points`, named by
   :func:`point_name`) trains retriever 1 on the fit part and is scored on the held-out part;
   a grid over ``finetune.reranker``'s trains the reranker on the fit part's BM25 negatives and
   reranks BM25's held-out run (the one first stage that never read a training query); the
   negatives' mix's and the distillation's train r2 and the distilled retriever on the fit part
   from pools (and a teacher) made on the fit part;
3. :func:`best_point` takes the point with the highest mean of the named metric; the rows then
   train with its settings on every training query (:func:`apply_settings`);
4. a fused row ``<row>+bm25``'s weight is chosen the same way (:func:`best_point` over the
   weights), with the chosen point's held-out run, by stage ``select_fusion``; the fusion itself
   is :mod:`dprflow.search.fusion`'s (not imported here: the retrievers' training imports this
   module, and a change to the fusion must not retrain them).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dprflow.errors import StageError

# The optimizer settings of every fine-tuning section a grid may vary.
OPTIM_KEYS = (
    "learning_rate",
    "epochs",
    "max_steps",
    "batch_size",
    "group_size",
    "warmup_ratio",
    "weight_decay",
)
# The finetune.retriever settings a grid may vary (the arguments of the retriever's training).
GRID_KEYS = (*OPTIM_KEYS, "temperature")
# The finetune.reranker settings a reranker grid may vary (finetune.select.reranker).
RERANKER_GRID_KEYS = (*OPTIM_KEYS, "head_learning_rate")
# The settings each section's grid may vary, by finetune.select's key (and selection.json's);
# negatives: retriever 2's mix of mined and BM25 negatives (finetune.r2_bm25_fraction); distill:
# finetune.distill's.
SECTION_KEYS = {
    "retriever": GRID_KEYS,
    "reranker": RERANKER_GRID_KEYS,
    "negatives": ("r2_bm25_fraction",),
    "distill": (*OPTIM_KEYS, "temperature", "alpha"),
}
# A config key whose training argument has another name.
ARGUMENT = {"r2_bm25_fraction": "extra_fraction"}
# The point of an empty grid: the settings as configured, trained on the fit part.
CONFIGURED = "configured"
FIT, HELDOUT = "fit", "heldout"


def heldout_ids(query_ids: Iterable[str], fraction: float, max_queries: int, seed: int) -> set[str]:
    """``round(fraction * n)`` of the ``n`` distinct ids (at least 1, at most ``max_queries`` and
    ``n - 1``), drawn in a seeded order that does not depend on the ids' order."""
    ids = sorted(set(query_ids))
    if len(ids) < 2:
        raise StageError(f"{len(ids)} judged training queries: none can be held out to choose settings on")
    n_held = min(len(ids) - 1, max_queries, max(1, round(fraction * len(ids))))
    return set(random.Random(seed).sample(ids, n_held))


def format_value(value: Any) -> str:
    """A setting's value as it appears in a point's name (YAML's spelling of booleans and null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def point_name(settings: Mapping[str, Any]) -> str:
    """A grid point's folder name: ``learning_rate=5e-05,epochs=4`` (the grid's key order), or
    :data:`CONFIGURED` for the settings as configured. Names, not numbers: a point keeps its
    folder (and its trained model) when the grid around it changes."""
    if not settings:
        return CONFIGURED
    return ",".join(f"{k}={format_value(v)}" for k, v in settings.items())


def grid_points(grid: Mapping[str, Sequence[Any]], section: str = "retriever") -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first key varying slowest; ``[{}]`` for an
    empty grid (one point: the settings as configured). ``section``: the finetune.select key
    whose grid it is (:data:`SECTION_KEYS`)."""
    allowed = SECTION_KEYS[section]
    unknown = sorted(set(grid) - set(allowed))
    if unknown:
        raise ValueError(
            f"finetune.select.{section}: unknown setting {unknown[0]!r}; allowed: {', '.join(allowed)}"
        )
    for key, values in grid.items():
        if not values:
            raise ValueError(f"finetune.select.{section}.{key}: an empty list of values")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def best_point(values: Mapping[Any, float]) -> Any:
    """The key (a grid point, a fusion weight) with the highest value; a tie goes to the first in
    the given order (the grid's), and a NaN never wins."""
    if not values:
        raise StageError("no grid point was scored")
    best, best_value = None, -math.inf
    for name, value in values.items():
        if value > best_value:  # NaN compares false
            best, best_value = name, value
    if best is None:
        raise StageError(f"every grid point scored NaN: {dict(values)}")
    return best


def apply_settings(args: Any, selection_path: str | Path, section: str = "retriever") -> dict[str, Any]:
    """Set on ``args`` the settings the selection file chose for ``section``; returns them."""
    with open(selection_path) as fh:
        return _set_chosen(args, json.load(fh), section, selection_path)


def _set_chosen(args: Any, choices: Mapping[str, Any], section: str, path: str | Path) -> dict[str, Any]:
    """Set on ``args`` the settings ``choices`` (a selection.json, read from ``path``) holds for
    ``section``, each under its training argument's name (:data:`ARGUMENT`)."""
    chosen = choices[section]["settings"]
    for key, value in chosen.items():
        name = ARGUMENT.get(key, key)
        if key not in SECTION_KEYS[section] or not hasattr(args, name):
            raise StageError(f"{path}: {section}.settings.{key} is not a setting of this stage")
        setattr(args, name, value)
    return chosen


def apply_selections(args: Any, paths: Sequence[str], sections: Sequence[str]) -> dict[str, Any]:
    """:func:`apply_settings` for every file of ``paths`` (each read once) and every one of
    ``sections`` it holds (r2 reads the retriever's choice and the negatives' mix); a file holding
    none is an error."""
    chosen: dict[str, Any] = {}
    for path in paths:
        with open(path) as fh:
            choices = json.load(fh)
        held = [s for s in sections if s in choices]
        if not held:
            raise StageError(f"{path}: no choice of {' or '.join(sections)}")
        for section in held:
            chosen.update(_set_chosen(args, choices, section, path))
    return chosen


def chosen_path(paths: Sequence[str], selection: str | None, section: str = "retriever") -> str:
    """The file (a run, a pool) of the point ``selection`` chose, ``paths`` in grid order; the only
    one without a selection."""
    if not selection:
        if len(paths) != 1:
            raise StageError(f"{len(paths)} grid points' files and no selection.json to say which was chosen")
        return paths[0]
    with open(selection) as fh:
        grid = json.load(fh)[section]
    names = [p["point"] for p in grid["points"]]
    if len(names) != len(paths):
        raise StageError(f"{selection}: {len(names)} grid points, but {len(paths)} files were given")
    return paths[names.index(grid["best"])]
