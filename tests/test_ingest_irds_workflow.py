"""Stage ``ingest`` with ``source: ir_datasets``, through Snakemake, offline: tiny local datasets,
one of passages (``text`` field, like msmarco-passage) and one of documents (``title`` + ``body``,
like msmarco-document), each with a train and a dev split.

The jobs are other processes, so the datasets are registered in each of them by a
``sitecustomize`` module on ``PYTHONPATH`` (Python imports it at start-up), which reads their
local files from the JSON file named by ``DPRFLOW_TEST_IRDS``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytest.importorskip("ir_datasets")

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

SITECUSTOMIZE = """
import json
import os

if os.environ.get("DPRFLOW_TEST_IRDS"):
    from typing import NamedTuple

    import ir_datasets
    from ir_datasets.datasets.base import Dataset
    from ir_datasets.formats import TrecQrels, TsvDocs, TsvQueries
    from ir_datasets.util import LocalDownload

    class BodyDoc(NamedTuple):  # like msmarco-document
        doc_id: str
        url: str
        title: str
        body: str

    with open(os.environ["DPRFLOW_TEST_IRDS"]) as fh:
        for name, spec in json.load(fh).items():
            kwargs = {"doc_cls": BodyDoc} if spec["documents"] else {}
            docs = TsvDocs(LocalDownload(spec["docs"]), **kwargs)
            ir_datasets.registry.register(name, Dataset(docs))
            for split in ("train", "dev"):
                queries = TsvQueries(LocalDownload(spec[split + "_queries"]))
                qrels = TrecQrels(LocalDownload(spec[split + "_qrels"]), {})
                ir_datasets.registry.register(f"{name}/{split}", Dataset(docs, queries, qrels))
"""


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture
def datasets(tmp_path):
    spec = {}
    for name, documents in (("dprflow-test-psg", False), ("dprflow-test-doc", True)):
        d = tmp_path / name
        d.mkdir()
        if documents:
            docs = "D1\thttp://a\tAlpha\tThe alpha body.\nD2\thttp://b\tBeta\tThe beta body.\n"
            docs += "D3\thttp://c\t\tNo title here.\n"
        else:
            docs = "D1\tthe alpha passage\nD2\tthe beta passage\nD3\tthe gamma passage\n"
        spec[name] = {
            "documents": documents,
            "docs": write(d / "docs.tsv", docs),
            "train_queries": write(d / "train_q.tsv", "q1\twhat is alpha\nq2\twhat is beta\n"),
            "train_qrels": write(d / "train.qrels", "q1 0 D1 1\nq2 0 D2 1\n"),
            "dev_queries": write(d / "dev_q.tsv", "q3\twhat is gamma\n"),
            "dev_qrels": write(d / "dev.qrels", "q3 0 D3 1\n"),
        }
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "irds.json").write_text(json.dumps(spec))
    return tmp_path


@pytest.mark.slow
def test_ingest_stage_loads_ir_datasets_passages_and_documents(datasets):
    config = yaml.safe_load((ROOT / "tests" / "data" / "tiny_workflow.yaml").read_text())
    config["collections"] = {
        short: {
            "source": "ir_datasets",
            "ir_datasets": {"train": f"{name}/train", "dev": f"{name}/dev"},
            "eval_split": "dev",
            "train_split": "train",
        }
        for short, name in (("psg", "dprflow-test-psg"), ("doc", "dprflow-test-doc"))
    }
    (datasets / "config.yaml").write_text(yaml.safe_dump(config))
    targets = [
        f"results/{c}/collection/{t}.parquet" for c in ("psg", "doc") for t in ("documents", "queries")
    ]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(datasets / "site"),
        "DPRFLOW_TEST_IRDS": str(datasets / "irds.json"),
        "IR_DATASETS_HOME": str(datasets / "ir_datasets_home"),
    }
    cmd = [SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(datasets), "--configfile",
           str(datasets / "config.yaml"), "--cores", "1", *targets]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    logs = "\n".join(p.read_text()[-1500:] for p in (datasets / "results" / "logs").rglob("ingest.log"))
    assert result.returncode == 0, result.stderr[-3000:] + logs

    collection = datasets / "results" / "psg" / "collection"
    docs = pd.read_parquet(collection / "documents.parquet")
    assert docs.to_dict("records") == [
        {"doc_id": f"D{i}", "title": "", "text": f"the {w} passage"}
        for i, w in ((1, "alpha"), (2, "beta"), (3, "gamma"))
    ]
    queries = pd.read_parquet(collection / "queries.parquet")
    assert sorted(queries[["query_id", "split"]].values.tolist()) == [
        ["q1", "train"],
        ["q2", "train"],
        ["q3", "dev"],
    ]
    qrels = pd.read_parquet(collection / "qrels.parquet")
    assert sorted(qrels[["query_id", "doc_id"]].values.tolist()) == [["q1", "D1"], ["q2", "D2"], ["q3", "D3"]]

    docs = pd.read_parquet(datasets / "results" / "doc" / "collection" / "documents.parquet")
    assert docs.to_dict("records") == [
        {"doc_id": "D1", "title": "Alpha", "text": "The alpha body."},
        {"doc_id": "D2", "title": "Beta", "text": "The beta body."},
        {"doc_id": "D3", "title": "", "text": "No title here."},
    ]
