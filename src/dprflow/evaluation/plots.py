"""The figures of the results report, one per question (matplotlib, Agg backend, PNG).

* :func:`training_loss`: loss against step for every training stage, one panel per stage kind
  (pre-training, r1, r2, rerank, distill), one line per method and collection, read from the
  ``train_log.csv`` every training stage writes beside its model.
* :func:`nb_recall`: nb-recall^n@k against k between retriever 1 and retriever 2, one panel per n,
  one line per method (coCondenser Figure 3).
* :func:`main_metric`: one metric per method and stage as grouped bars, BM25 and the initial
  model off the shelf as reference lines, error bars (standard deviation over seeds) when the
  table has them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dprflow.plan.rows import BM25, OFF_THE_SHELF, STAGES


def _pyplot():
    """matplotlib's pyplot on the Agg backend, imported when a figure is drawn, not with the module
    (the stage that imports this module pays for matplotlib only when it plots; issue 15)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> None:
    plt = _pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def _message(text: str, path) -> None:
    """A figure holding only ``text``: what a report shows where a run has nothing to plot."""
    fig, ax = _pyplot().subplots(figsize=(6.5, 2.0))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center")
    _save(fig, path)


def training_loss(logs: pd.DataFrame, path) -> None:
    """``logs``: columns ``collection, method, stage, step, loss`` (stage: pretrain-generic,
    pretrain-corpus, r1, r2, rerank, distill) and optionally ``seed`` (a line per seed). Empty (a
    run that trains nothing: zero-shot rows only): a figure that says so."""
    if logs.empty:
        return _message("No training loss: this run trains no model (zero-shot rows only).", path)
    stages = list(dict.fromkeys(logs["stage"]))
    cols = min(3, len(stages))
    rows = int(np.ceil(len(stages) / cols))
    fig, axes = _pyplot().subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, stage in zip(axes.flat, stages, strict=False):
        part = logs[logs["stage"] == stage]
        seeds = "seed" in part and part["seed"].nunique() > 1
        keys = ["collection", "method"] + (["seed"] if seeds else [])
        for key, line in part.groupby(keys, sort=False):
            label = key[1] if logs["collection"].nunique() == 1 else f"{key[0]} {key[1]}"
            label += f" seed {key[2]}" if seeds else ""
            ax.plot(line["step"], line["loss"], marker=".", label=label)
        ax.set_title(stage)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(stages) :]:
        ax.axis("off")
    fig.suptitle("Training loss per stage")
    _save(fig, path)


NO_NB_RECALL = (
    "No nb-recall: it compares retriever 1's ranking with retriever 2's,\n"
    "and no method of this run trains both (finetune.stages, finetune.stages_of)."
)


def nb_recall(table: pd.DataFrame, path) -> None:
    """``table``: columns ``collection, method, n, k, value`` (with several seeds, their mean).
    Empty (no method of the run trains both retrievers): a figure that says so."""
    if table.empty:
        return _message(NO_NB_RECALL, path)
    ns = sorted(table["n"].unique())
    fig, axes = _pyplot().subplots(1, len(ns), figsize=(4.5 * len(ns), 3.4), squeeze=False)
    for ax, n in zip(axes.flat, ns, strict=True):
        part = table[table["n"] == n]
        for (collection, method), line in part.groupby(["collection", "method"], sort=False):
            label = method if table["collection"].nunique() == 1 else f"{collection} {method}"
            line = line.sort_values("k")
            ax.plot(line["k"], line["value"], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"nb-recall$^{{{n}}}$@k, retriever 1 vs 2")
        ax.set_xlabel("k")
        ax.set_ylabel("share of r2's top n in r1's top k")
        ax.legend(fontsize=7)
    _save(fig, path)


def main_metric(table: pd.DataFrame, metric: str, path, references=(BM25, OFF_THE_SHELF)) -> None:
    """``table``: the comparison CSV (``collection, system, metric, value`` and, with several
    seeds, ``std``). Bars: methods grouped by stage; lines: the reference rows."""
    part = table[table["metric"] == metric]
    if part.empty:
        raise ValueError(f"metric {metric!r} is not in the comparison table")
    collections = list(dict.fromkeys(part["collection"]))
    fig, axes = _pyplot().subplots(1, len(collections), figsize=(6.5 * len(collections), 3.8), squeeze=False)
    for ax, collection in zip(axes.flat, collections, strict=True):
        rows = part[part["collection"] == collection]
        trained = rows[~rows["system"].isin(references)]
        methods = list(dict.fromkeys(s.split("/")[0] for s in trained["system"]))
        stages = [s for s in STAGES if any(trained["system"].str.endswith("/" + s))]
        width = 0.8 / max(1, len(methods))
        x = np.arange(len(stages))
        values = rows.set_index("system")
        for i, method in enumerate(methods):
            heights = [values["value"].get(f"{method}/{s}", np.nan) for s in stages]
            errors = None
            if "std" in values:
                errors = [values["std"].get(f"{method}/{s}", np.nan) for s in stages]
            ax.bar(
                x + (i - (len(methods) - 1) / 2) * width, heights, width, yerr=errors, label=method, capsize=2
            )
        for ref, style in zip(references, ("--", ":"), strict=False):
            if ref in values.index:
                ax.axhline(values.loc[ref, "value"], color="black", linestyle=style, label=ref)
        ax.set_xticks(x, stages)
        ax.set_ylabel(metric)
        ax.set_title(f"{collection}: {metric}")
        ax.legend(fontsize=7, ncol=2)
    _save(fig, path)
