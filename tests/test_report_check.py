"""The report pieces (figures, comparison page with provenance, training logs) and the check stage
(expected metrics with tolerances; a doctored value must fail)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.image import imread

from dprflow.evaluation import plots, report
from dprflow.evaluation.compare import to_markdown
from dprflow.stages import check

ROOT = Path(__file__).resolve().parents[1]

TABLE = pd.DataFrame(
    [
        ("c", "bm25", "RR@10", 0.30, 50),
        ("c", "none/zeroshot", "RR@10", 0.25, 50),
        ("c", "none/r1", "RR@10", 0.40, 50),
        ("c", "none/r2", "RR@10", 0.45, 50),
        ("c", "cdmae/r1", "RR@10", 0.42, 50),
        ("c", "cdmae/r2", "RR@10", 0.48, 50),
    ],
    columns=["collection", "system", "metric", "value", "n_queries"],
)


def not_blank(path) -> bool:
    image = imread(path)
    return image.shape[0] > 100 and float(np.std(image[..., :3])) > 0.01


def test_figures_are_drawn(tmp_path):
    plots.main_metric(TABLE.assign(std=0.01), "RR@10", tmp_path / "bars.png")
    nb = pd.DataFrame(
        [
            ("c", m, n, k, min(1.0, k / (2 * n)))
            for m in ("none", "cdmae")
            for n in (50, 100)
            for k in (10, 100, 1000)
        ],
        columns=["collection", "method", "n", "k", "value"],
    )
    plots.nb_recall(nb, tmp_path / "nb.png")
    logs = pd.DataFrame(
        [
            ("c", m, seed, s, step, 2.0 / step + seed)
            for m in ("none", "cdmae")
            for seed in (1, 2)
            for s in ("r1", "r2")
            for step in range(1, 6)
        ],
        columns=["collection", "method", "seed", "stage", "step", "loss"],
    )
    plots.training_loss(logs, tmp_path / "loss.png")
    assert all(not_blank(tmp_path / f) for f in ("bars.png", "nb.png", "loss.png"))
    with pytest.raises(ValueError, match="nDCG@10"):
        plots.main_metric(TABLE, "nDCG@10", tmp_path / "none.png")


def test_comparison_page_renders_the_table_and_each_rows_provenance(tmp_path):
    md = "# dprflow comparison\n\n| system | c RR@10 |\n|---|---|\n| bm25 | 0.3000 z↑ |\n\nQueries scored: c: 50.\n"
    results = tmp_path / "results"
    (results / "c" / "none" / "seed-13" / "r1" / "model").mkdir(parents=True)
    record = {"stage": "train_retriever", "args": {"learning_rate": 2e-5}, "inputs": {"a": "f" * 64},
              "code": {"commit": "a" * 40, "dirty": False}, "started": "now", "wall_seconds": 1.5}  # fmt: skip
    (results / "c" / "none" / "seed-13" / "r1" / "model" / "provenance.json").write_text(json.dumps(record))
    (results / "c" / "none" / "seed-13" / "r1" / "metrics.parquet.provenance.json").write_text(
        json.dumps(record)
    )
    page = report.comparison_page(md, results, TABLE)
    assert "<th>c RR@10</th>" in page and "<td>0.3000 z↑</td>" in page
    assert "<h3>c none/r1</h3>" in page and "none/seed-13/r1/model" in page and "aaaaaaaaaa" in page
    assert "none/seed-13/r1/metrics.parquet" in page and "learning_rate" in page


def test_training_logs_are_read_from_model_folders(tmp_path):
    results = tmp_path / "results"
    for folder in ("c/none/seed-13/r1/model", "pretrain/cdmae/generic/model", "c/cdmae/pretrain/model"):
        (results / folder).mkdir(parents=True)
        pd.DataFrame({"step": [1, 2], "lr": [0.1, 0.1], "loss": [2.0, 1.0]}).to_csv(
            results / folder / "train_log.csv"
        )
    dirs = [
        str(results / f)
        for f in ("c/none/seed-13/r1/model", "pretrain/cdmae/generic/model", "c/cdmae/pretrain/model")
    ]
    logs = report.training_logs(dirs, results)
    got = set(map(tuple, logs[["collection", "method", "seed", "stage"]].drop_duplicates().values))
    assert got == {
        ("c", "none", "13", "r1"),
        ("generic", "cdmae", "", "pretrain-generic"),
        ("c", "cdmae", "", "pretrain-corpus"),
    }
    (results / "c/none/seed-13/r1/model/train_log.csv").unlink()
    with pytest.raises(FileNotFoundError, match="train_log.csv"):
        report.training_logs(dirs, results)


def test_check_passes_then_fails_on_a_doctored_value(tmp_path, capsys):
    csv = tmp_path / "compare.csv"
    TABLE.to_csv(csv, index=False)
    expected = tmp_path / "expected.yaml"
    assert check.main(["--compare-csv", str(csv), "--expected", str(expected), "--update", "true"]) == 0
    out = tmp_path / "check.txt"
    assert check.main(["--compare-csv", str(csv), "--expected", str(expected), "--out", str(out)]) == 0
    assert out.read_text().count("OK ") == len(TABLE)
    data = yaml.safe_load(expected.read_text())
    data["rows"][2]["value"] += 0.01  # none/r1 now expected 0.41 ± 0.005
    expected.write_text(yaml.safe_dump(data))
    out.unlink()
    capsys.readouterr()
    assert check.main(["--compare-csv", str(csv), "--expected", str(expected), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "FAIL    c none/r1 RR@10: expected 0.4100" in printed and printed.count("OK ") == len(TABLE) - 1
    assert not out.exists()
    data["rows"][2]["tolerance"] = 0.02  # a per-row tolerance wins over the default
    expected.write_text(yaml.safe_dump(data))
    assert check.main(["--compare-csv", str(csv), "--expected", str(expected)]) == 0
    data["rows"].append({"collection": "c", "system": "bmae/r1", "metric": "RR@10", "value": 0.4})
    expected.write_text(yaml.safe_dump(data))
    assert check.main(["--compare-csv", str(csv), "--expected", str(expected)]) == 1
    assert "MISSING c bmae/r1" in capsys.readouterr().out


BROWSER = any(
    shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
)


def test_a_run_without_retriever_2_or_training_gets_a_report_whose_figures_say_why(tmp_path):
    """finetune.stages [r1] (the study's geometry controls) gives no nb-recall tables, and a run of
    zero-shot rows no training logs. The report stage stopped with pandas' 'No objects to
    concatenate' and 'no training logs to plot'; each figure now says what is missing."""
    from dprflow.stages import report_results

    results = tmp_path / "results"
    results.mkdir()
    TABLE.to_csv(results / "compare.csv", index=False)
    (results / "compare.md").write_text("# dprflow comparison\n")
    out = {
        name: str(results / "report" / name)
        for name in ("loss.png", "nb.png", "metric.png", "c.html", "c.yaml")
    }
    (results / "report").mkdir()
    argv = ["--compare-csv", str(results / "compare.csv"), "--compare-md", str(results / "compare.md")]
    argv += ["--results-dir", str(results), "--config-json", "{}", "--metric", "RR@10", "--nb-recall"]
    argv += ["--models", "--out-loss", out["loss.png"], "--out-nb-recall", out["nb.png"]]
    argv += ["--out-metric", out["metric.png"], "--out-html", out["c.html"], "--out-config", out["c.yaml"]]
    assert report_results.main(argv) == 0
    assert all(not_blank(out[name]) for name in ("nb.png", "loss.png", "metric.png"))


@pytest.mark.skipif(not BROWSER, reason="no headless browser (make render-check installs Debian's chromium)")
def test_render_check_fails_on_a_blank_figure_and_a_missing_row(tmp_path):
    """scripts/check_report_render.py in headless Chromium: a blank figure and a table without one
    of compare.csv's rows fail, the intact figures pass (the workflow test runs it on a whole
    report, where every check passes)."""
    results = tmp_path / "results"
    pieces = results / "report"
    pieces.mkdir(parents=True)
    TABLE.to_csv(results / "compare.csv", index=False)
    md = "# dprflow comparison\n\n" + to_markdown(TABLE, ["bm25"], ["none", "cdmae"], ["RR@10"])
    (pieces / "comparison.html").write_text(report.comparison_page(md, results, TABLE))
    plots.main_metric(TABLE, "RR@10", pieces / "main_metric.png")
    nb = pd.DataFrame(
        [("c", "none", 10, k, k / 100) for k in (10, 50, 100)],
        columns=["collection", "method", "n", "k", "value"],
    )
    plots.nb_recall(nb, pieces / "nb_recall.png")
    logs = pd.DataFrame(
        [("c", "none", "r1", s, 1.0 / s) for s in (1, 2, 3)],
        columns=["collection", "method", "stage", "step", "loss"],
    )
    plots.training_loss(logs, pieces / "training_loss.png")
    script = [sys.executable, str(ROOT / "scripts" / "check_report_render.py"), "--results", str(results)]
    plt.imsave(pieces / "nb_recall.png", np.ones((300, 400, 3)))  # a blank image
    (pieces / "comparison.html").write_text(
        report.comparison_page(md.replace("| cdmae/r2 |", "| other |"), results, TABLE)
    )
    bad = subprocess.run(script, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert "FAIL figure nb_recall.png drawn" in bad.stdout
    assert "FAIL comparison table: 5/6 rows, missing ['cdmae/r2']" in bad.stdout
    assert "OK   figure main_metric.png drawn" in bad.stdout
    assert "OK   figure training_loss.png decoded" in bad.stdout
