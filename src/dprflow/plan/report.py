"""What the comparison, the report and the run's end read: every row's metrics and encoder, the
table's method order, every trained model's folder and upload-ready folder, retriever 1's and
2's recall of the negatives, the config the report records, and the expected-metrics file of
``make check``."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from dprflow.plan import UnderResults
from dprflow.plan.methods import BY_NAME
from dprflow.plan.models import ModelPlan
from dprflow.plan.rows import is_dense, seed_folder, trained
from dprflow.plan.run_rows import RunRows
from dprflow.rule_flags import RESOURCE_SETTINGS


class ReportPlan(UnderResults):
    """The comparison's and the report's inputs (rules/evaluation.smk, rules/report.smk) and the
    files the run's end checks (the Snakefile's ``all``)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        results: str,
        rows: RunRows,
        models: ModelPlan,
        references: Mapping[str, Any],
    ) -> None:
        self.config, self.results, self.rows, self.models = config, results, rows, models
        self.references = list(references)

    def _trained(self) -> list[tuple[str, str, int, str]]:
        """(collection, method, seed, stage) of every trained model of every row."""
        return [
            (c, m, seed, stage)
            for c in self.rows.training_collections()
            for m in self.config["methods"]
            for seed, stage in self.rows.seeded_stages(m)
        ]

    # ---- the comparison ------------------------------------------------------------------------

    def metrics_files(self) -> list[str]:
        return [self.path(c, s, "metrics.parquet") for c, s in self.rows.scored()]

    def encoder_files(self) -> list[str]:
        """The encoder.json of every dense row: the pooling and similarity the table shows."""
        return [self.path(c, s, "encoder.json") for c, s in self.rows.scored() if is_dense(s)]

    def row_order(self) -> list[str]:
        """The method order of the table's rows: the reference models first, then config methods."""
        return [*self.references, *self.config["methods"]]

    # ---- the trained models --------------------------------------------------------------------

    def hub_folders(self) -> list[str]:
        """The upload-ready folder of every trained model of every row (export_model)."""
        return [self.path(c, trained(m, seed, stage), "hub") for c, m, seed, stage in self._trained()]

    def nb_recall_files(self) -> list[str]:
        """Retriever 1's and 2's recall of the negatives (methods with both rows)."""
        return [
            self.path(c, m, seed_folder(s), "nb_recall.parquet")
            for c in self.rows.training_collections()
            for m in self.config["methods"]
            if {"r1", "r2"} <= set(self.rows.stages(m))
            for s in self.rows.seeds(m, "r2")
        ]

    def pretrained_models(self, collection: str, method: str) -> list[str]:
        """Every pre-training model folder of a method (stage one and two), for the loss curves."""
        record = BY_NAME.get(method)  # a reference row's method has none
        if record is None or record.family is None:
            return []
        stage_one = []
        if record.family == "condenser":
            stage_one = self.models.condenser_stage_one()
        elif record.family == "mae" and not self.config["pretrain"]["mae"]["corpus_init"]:
            # no generic stage when the corpus stage starts from pretrain.mae.corpus_init
            stage_one = [self.path("pretrain", record.generic, "generic", "model")]
        corpus = [self.path(collection, method, "pretrain", "model")] if record.corpus_stage else []
        return stage_one + corpus

    def training_model_dirs(self) -> list[str]:
        """The model folder of every training stage of the run; each holds its train_log.csv."""
        dirs = [self.models.mlm_model] if self.models.mlm_base else []
        for c in self.rows.training_collections():
            for m in self.config["methods"]:
                dirs += self.pretrained_models(c, m)
                dirs += [self.path(c, trained(m, seed, s), "model") for seed, s in self.rows.seeded_stages(m)]
        return list(dict.fromkeys(dirs))

    # ---- the report's record and make check ----------------------------------------------------

    def config_json(self) -> str:
        """The config the report records, less RESOURCE_SETTINGS: they change no result, and a
        param of the report's rule would rerun it when one changed; and less model.mlm unless
        model.init is mlm (no model is trained from it then)."""
        recorded = copy.deepcopy(dict(self.config))
        if not self.models.mlm_base:
            recorded["model"].pop("mlm", None)
        for key in RESOURCE_SETTINGS:
            *sections, name = key.split(".")
            node = recorded
            for section in sections:
                node = node.get(section, {})
            node.pop(name, None)
        return json.dumps(recorded, sort_keys=True)

    def expected_metrics_file(self, wildcards: Any = None) -> str:
        path = self.config["evaluation"]["expected"]
        if not path:
            raise ValueError(
                "evaluation.expected is not set: name a file of expected metrics to check against"
            )
        return path


def compare_results_dir(wildcards: Any, output: Any) -> str:
    """The results folder the compared metrics files are relative to (where compare.md goes)."""
    return os.path.dirname(output.md)


def report_results_dir(wildcards: Any, output: Any) -> str:
    """The results folder (the report pages live in its report/ subfolder)."""
    return os.path.dirname(os.path.dirname(output.html))
