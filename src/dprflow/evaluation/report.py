"""The pieces of the results report that are not figures: the comparison as an HTML page with the
provenance of every row, and the training logs gathered from the model folders.

The comparison page renders ``results/compare.md`` (headings, pipe tables and paragraphs, the only
Markdown it holds) and appends, per row of the table, the provenance records
(:mod:`dprflow.provenance`) of the artifacts that made it: the metrics, the run, the models of
that stage, and the method's pre-trained encoders.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from dprflow import provenance
from dprflow.plan import rows as plan_rows


def markdown_to_html(text: str) -> str:
    """Headings, pipe tables and paragraphs of our Markdown, as HTML."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if not line:
            i += 1
            continue
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 6)
            out.append(f"<h{level}>{html.escape(line[level:].strip())}</h{level}>")
            i += 1
        elif line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            out.append(_table(block))
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("|", "#")):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{html.escape(' '.join(para))}</p>")
    return "\n".join(out)


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _table(block: list[str]) -> str:
    head, body = _cells(block[0]), [r for r in block[1:] if not set(r.replace("|", "").strip()) <= {"-", ":"}]
    parts = ["<table>", "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>"]
    for row in body:
        parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(row)) + "</tr>")
    parts.append("</table>")
    return "\n".join(parts)


# A row's exports (export_model's hub/, export_faiss's faiss/) are made from its results, not
# behind them, and are not inputs of the report: a job may be rewriting one while the report is
# built (a changed compare.csv reruns every hub export), so the walk does not enter them.
EXPORTS = ("hub", "faiss")


def _walk(folder: Path) -> Iterator[Path]:
    """Every file below ``folder`` except those in its exports' folders."""
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in EXPORTS]
        yield from (Path(root) / name for name in files)


def row_artifacts(results: Path, collection: str, system: str, trained_on: str = "") -> list[Path]:
    """The artifacts behind one row of the table that carry a provenance record: a fine-tuned row
    ``<method>/<stage>`` gathers the folders of every seed (``<method>/seed-<seed>/<stage>``). A
    row trained on another collection than the one it is scored on (``trained_on``, transfer)
    lives in ``<trained_on>/<system>/on-<collection>``, beside its model."""
    method, _, stage = system.partition("/")
    home = trained_on or collection
    folders = [results / home / system]
    if stage and stage != plan_rows.ZEROSHOT:
        folders = sorted((results / home / method).glob(plan_rows.seed_folder("*") + f"/{stage}"))
    transfer = home != collection
    if transfer:
        folders = [folder / plan_rows.transfer_folder(collection) for folder in folders]
    paths = sorted(
        p
        for folder in folders
        for p in _walk(folder)
        if (p.name.endswith(provenance.SUFFIX) or p.name == provenance.FOLDER_FILE)
        and (
            transfer
            or not any(part.startswith(plan_rows.TRANSFER_PREFIX) for part in p.relative_to(folder).parts)
        )
    )
    if transfer:  # the models it was scored with
        paths += sorted(
            provenance.record_path(folder.parent / "model")
            for folder in folders
            if provenance.record_path(folder.parent / "model").is_file()
        )
    if system != "bm25" and method != "none":
        for pre in (
            results / home / method / "pretrain" / "model",
            results / "pretrain" / method / "generic" / "model",
        ):
            if provenance.record_path(pre).is_file():
                paths.append(provenance.record_path(pre))
    return paths


def _artifact_of(record_file: Path) -> Path:
    if record_file.name == provenance.FOLDER_FILE:
        return record_file.parent
    return record_file.with_name(record_file.name[: -len(provenance.SUFFIX)])


def provenance_html(results: Path, table: pd.DataFrame) -> str:
    """One section per row of the comparison: stage, artifact, commit, dirty tree, wall time, inputs."""
    parts = ["<h2>Provenance of each row</h2>"]
    if "training_collection" not in table:
        table = table.assign(training_collection="")
    rows = table[["collection", "system", "training_collection"]].fillna("").drop_duplicates()
    for collection, system, trained_on in rows.itertuples(index=False):
        source = f" (trained on {trained_on})" if trained_on and trained_on != collection else ""
        parts.append(f"<h3>{html.escape(collection)} {html.escape(system)}{html.escape(source)}</h3>")
        records = row_artifacts(results, collection, system, trained_on)
        if not records:
            parts.append("<p>No provenance records.</p>")
            continue
        parts.append(
            "<table><tr><th>artifact</th><th>stage</th><th>commit</th><th>dirty</th><th>started</th>"
            "<th>wall s</th><th>inputs (sha256)</th><th>arguments</th></tr>"
        )
        for path in records:
            rec = json.loads(path.read_text())
            artifact = _artifact_of(path)
            inputs = "<br>".join(
                f"{html.escape(k)}: {v[:12]}" for k, v in sorted(rec.get("inputs", {}).items())
            )
            commit = (rec.get("code") or {}).get("commit") or ""
            args = html.escape(json.dumps(rec.get("args", {}), sort_keys=True))
            parts.append(
                f"<tr><td>{html.escape(str(artifact.relative_to(results)))}</td><td>{html.escape(rec.get('stage', ''))}</td>"
                f"<td>{commit[:10]}</td><td>{(rec.get('code') or {}).get('dirty')}</td>"
                f"<td>{html.escape(str(rec.get('started', '')))}</td><td>{rec.get('wall_seconds', '')}</td>"
                f"<td>{inputs}</td><td><details><summary>show</summary><code>{args}</code></details></td></tr>"
            )
        parts.append("</table>")
    return "\n".join(parts)


def tensorboard_html(results: Path, model_dirs: list[str]) -> str:
    """Where each training stage's TensorBoard event files are (``<model>/tensorboard``), and the
    command that shows them all."""
    found = [Path(d) / "tensorboard" for d in model_dirs if (Path(d) / "tensorboard").is_dir()]
    parts = ["<h2>Training curves (TensorBoard)</h2>"]
    if not found:
        parts.append(
            "<p>No TensorBoard event files: install the tensorboard package (<code>pip install "
            "'dprflow[tracking]'</code>) before training; the losses are in each model's train_log.csv.</p>"
        )
        return "\n".join(parts)
    parts.append(
        f"<p>{len(found)} training stages wrote event files (loss terms, learning rate, gradient norm, "
        f"tokens/s): <code>tensorboard --logdir {html.escape(str(results))}</code></p><ul>"
    )
    for path in found:
        rel = (
            path.resolve().relative_to(results.resolve())
            if path.resolve().is_relative_to(results.resolve())
            else path
        )
        parts.append(f"<li><code>{html.escape(str(rel))}</code></li>")
    parts.append("</ul>")
    return "\n".join(parts)


def comparison_page(
    markdown: str, results: Path, table: pd.DataFrame, model_dirs: list[str] | None = None
) -> str:
    style = (
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #bbb;padding:3px 7px;font-size:13px;vertical-align:top}"
        "th{background:#eee}code{font-size:11px;word-break:break-all}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>dprflow comparison</title>"
        f"<style>{style}</style></head><body>\n{markdown_to_html(markdown)}\n"
        f"{tensorboard_html(results, model_dirs) if model_dirs is not None else ''}\n"
        f"{provenance_html(results, table)}\n</body></html>\n"
    )


def training_logs(model_dirs: list[str], results: Path) -> pd.DataFrame:
    """``collection, method, seed, stage, step, loss`` from each model folder's ``train_log.csv``.

    Folders are ``<results>/<collection>/<method>/seed-<seed>/<stage>/model`` (fine-tuning),
    ``<results>/<collection>/<method>/pretrain/model`` (corpus pre-training, stage
    ``pretrain-corpus``) or ``<results>/pretrain/<method>/generic/model`` (stage
    ``pretrain-generic``); pre-training has seed "".
    """
    frames = []
    for d in model_dirs:
        parts = Path(d).resolve().relative_to(results.resolve()).parts
        seed = ""
        if parts[0] == "pretrain":
            collection, method, stage = "generic", parts[1], "pretrain-generic"
        elif parts[2] == "pretrain":
            collection, method, stage = parts[0], parts[1], "pretrain-corpus"
        elif parts[2].startswith(plan_rows.SEED_PREFIX) and len(parts) == 5:
            collection, method, seed, stage = (
                parts[0],
                parts[1],
                parts[2].removeprefix(plan_rows.SEED_PREFIX),
                parts[3],
            )
        else:
            raise ValueError(f"{d}: not a model folder of a training stage")
        log_file = Path(d) / "train_log.csv"
        if not log_file.is_file():
            raise FileNotFoundError(f"{log_file}: a training stage's model folder without its loss log")
        frame = pd.read_csv(log_file, usecols=["step", "loss"])
        frames.append(frame.assign(collection=collection, method=method, seed=seed, stage=stage))
    if not frames:
        return pd.DataFrame(columns=["collection", "method", "seed", "stage", "step", "loss"])
    return pd.concat(frames, ignore_index=True)
