"""The collections' plan: each collection's settings (or a pre-training corpus's, ingested alike),
its query splits, the collection a row is scored on (its own, or a transfer target), and the
ingest jobs' inputs and flags.

The rules hold one :class:`CollectionPlan` (rules/common.smk, ``COLLECTIONS``) and name its
methods as input and params functions; those that take ``wildcards`` are such functions.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from typing import Any

from dprflow.plan import UnderResults, rows
from dprflow.rule_flags import q


class CollectionPlan(UnderResults):
    def __init__(self, config: dict, results: str, training: list[str]):
        """``training``: the collections that train rows (RunRows.training_collections)."""
        self.collections = config["collections"]
        self.corpora = config["pretrain"]["corpora"]
        self.results = results
        self.training = training

    def spec(self, wildcards) -> dict[str, Any]:
        """A collection's config, or a pre-training corpus's (pretrain.corpora: ingested alike)."""
        name = wildcards.collection
        return self.collections[name] if name in self.collections else self.corpora[name]

    def eval_split(self, wildcards) -> str:
        return self.spec(wildcards)["eval_split"]

    def train_split(self, wildcards) -> str:
        return self.spec(wildcards)["train_split"]

    # ---- where a row is scored -----------------------------------------------------------------

    @staticmethod
    def scored_collection(wildcards) -> str:
        """The collection a row's run is scored on: its ``target`` wildcard or ``/on-<collection>``
        suffix (transfer), else the collection it lives in."""
        target = getattr(wildcards, "target", None)
        for key in ("system", "retriever"):
            value = getattr(wildcards, key, None)
            if value is not None and target is None:
                target = rows.split_transfer(value)[1]
        return target or wildcards.collection

    def of_scored_collection(self, path: Any) -> Callable[[Any], str]:
        """An input function: ``path``, a pattern of ``{collection}`` (a rule's output), for the
        collection the row is scored on (its own for a row scored where it was trained)."""

        def resolved(wildcards) -> str:
            return str(path).replace("{collection}", self.scored_collection(wildcards))

        return resolved

    def scored_eval_split(self, wildcards) -> str:
        return self.collections[self.scored_collection(wildcards)]["eval_split"]

    # ---- ingest --------------------------------------------------------------------------------

    def ingest_out_dir(self, wildcards) -> str:
        return self.path(wildcards.collection, "collection")

    def ingest_inputs(self, wildcards) -> list[str]:
        """BEIR files are inputs (a changed file reruns ingest); other sources have none."""
        spec = self.spec(wildcards)
        if spec["source"] != "beir":
            return []
        root = spec["path"]
        files = [os.path.join(root, "corpus.jsonl"), os.path.join(root, "queries.jsonl")]
        qrels = [os.path.join(root, "qrels", f"{s}.tsv") for s in ("train", "dev", "test")]
        return files + [p for p in qrels if os.path.exists(p)]

    def ingest_flags(self, wildcards) -> str:
        spec = self.spec(wildcards)
        flags = [f"--source {q(spec['source'])}"]
        if spec["source"] == "embedded" and spec.get("max_documents") is not None:
            flags.append(f"--max-documents {q(spec['max_documents'])}")
        if spec["source"] == "embedded":
            share = spec["split_percent"]
            flags.append(f"--split-percent {q(share['train'])} {q(share['dev'])} {q(share['test'])}")
        if spec["source"] == "beir":
            flags.append(f"--path {shlex.quote(spec['path'])}")
        if spec["source"] == "ir_datasets":
            flags.append(f"--ir-datasets {shlex.quote(json.dumps(spec['ir_datasets']))}")
        return " ".join(flags)

    # ---- what the comparison reads about each collection -------------------------------------

    def paper_references(self) -> list[str]:
        """collection=reference pairs for the comparison's table beside the papers."""
        return [f"{c}={spec['reference']}" for c, spec in self.collections.items() if spec["reference"]]

    def scored_splits(self) -> list[str]:
        """collection=split pairs: the query split each collection's comparison scores."""
        return [f"{c}={spec['eval_split']}" for c, spec in self.collections.items()]

    def trained_on_collections(self) -> list[str]:
        """Collections whose scored split is their training split (score_training_queries)."""
        return [
            c
            for c in self.training
            if self.collections[c]["eval_split"] == self.collections[c]["train_split"]
        ]

    def trec_qrels_files(self) -> list[str]:
        """Each collection's qrels of its scored split as a TREC file, beside the rows' runs."""
        return [
            self.path(c, "collection", f"qrels.{spec['eval_split']}.trec")
            for c, spec in self.collections.items()
        ]
