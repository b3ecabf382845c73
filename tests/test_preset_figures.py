"""The paper presets train the papers' experiments: quantities derived from each preset's planned
jobs (a Snakemake dry run: the command lines, never run) against the figures in
``config/presets/figures/papers.yaml``, and ``config/presets/README.md``'s tables against that file.

Derived per stage (tests/preset_figures.py) from the command lines only (never from the preset's
keys, so that a key the workflow ignores or overrides shows up): optimizer steps (with the trainer's own
:func:`steps_run` and :func:`total_steps` over the number of items the stage iterates, from the
table's sizes), documents / spans / queries and passages per update, the contrastive batch and the
negatives per query *after* gradient accumulation and processes (each micro-batch is its own
contrastive batch, gathered over the processes: :mod:`dprflow.training.steps`), the negative pools
and their mix, the corpus and initial model of each stage, masking, learning rates and schedules,
the reranker's depth, the distillation objective, and the evaluation.

A figure is the paper's value, or a deliberate difference: the entry then also names the
``paper`` value and the ``reason``; the README marks such rows **deliberate**.
"""

from __future__ import annotations

from typing import Any

import pytest
from preset_figures import FIGURES, ROOT, wrong_figures

README = ROOT / "config" / "presets" / "README.md"


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(FIGURES["presets"]))
def test_preset_trains_the_papers_experiment(preset, tmp_path):
    wrong = wrong_figures(preset, ROOT / "config" / "presets" / f"{preset}.yaml", tmp_path)
    assert not wrong, "\n".join(wrong)


def test_the_figures_table_names_a_source_for_every_value():
    assert {p.stem for p in (ROOT / "config" / "presets").glob("*.yaml")} == set(FIGURES["presets"])
    for stages in FIGURES["presets"].values():
        for figures in stages.values():
            for figure in figures.values():
                assert set(figure) in ({"value", "source"}, {"value", "source", "paper", "reason"}), figure
                assert figure["source"] and figure.get("reason", "-")


def fmt(value: Any) -> str:
    """A table cell: numbers as a reader writes them, a '|' escaped."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = str(value)
    return text.replace("|", "\\|")


def readme_table(preset: str) -> str:
    """The README's table of a preset: one row per figure, deliberate differences marked."""
    lines = ["| stage | quantity | preset | paper | source |", "|---|---|---|---|---|"]
    for stage, figures in FIGURES["presets"][preset].items():
        for quantity, figure in figures.items():
            if "paper" in figure:
                paper = f"**deliberate**: {fmt(figure['paper'])} ({fmt(figure['reason'])})"
            else:
                paper = "same"
            lines.append(
                f"| {stage} | {quantity} | {fmt(figure['value'])} | {paper} | {fmt(figure['source'])} |"
            )
    return "\n".join(lines)


@pytest.mark.parametrize("preset", sorted(FIGURES["presets"]))
def test_the_readme_tabulates_every_figure(preset):
    """Each README row is a figure of the table (checked against the preset above) and each
    figure is a README row: regenerate with ``python tests/test_preset_figures.py``."""
    text = README.read_text()
    assert f"## {preset}.yaml" in text
    section = text.split(f"## {preset}.yaml", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert "\n".join(rows) == readme_table(preset)


if __name__ == "__main__":  # print the README tables
    for name in sorted(FIGURES["presets"]):
        print(f"## {name}.yaml\n\n{readme_table(name)}\n")
