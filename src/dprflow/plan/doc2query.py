"""The doc2query generator's plan (query-as-context, pretrain.doc2query): the model that
generates (a configured seq2seq model, else the one train_doc2query trains on the collection)
and the training and generation jobs' flags.

The rules hold one :class:`Doc2QueryPlan` (rules/common.smk, ``DOC2QUERY``) and name its methods
as input and params functions.
"""

from __future__ import annotations

import shlex

from dprflow.plan import UnderResults
from dprflow.plan.collections import CollectionPlan
from dprflow.plan.pretrain import content_fingerprint, local_paths
from dprflow.rule_flags import precision_flag, q, schema_flags, training_flags


class Doc2QueryPlan(UnderResults):
    def __init__(self, config: dict, schema: str, results: str, collections: CollectionPlan):
        self.config, self.schema, self.results = config, schema, results
        self.settings = config["pretrain"]["doc2query"]
        self.seed = config["finetune"]["seed"]
        self.collections = collections

    def model(self, wildcards) -> str:
        """The generator: pretrain.doc2query.model, else the one trained on the collection."""
        return self.settings["model"] or self.path(wildcards.collection, "doc2query", "model")

    def model_input(self, wildcards) -> list[str]:
        """The trained generator folder, unless config names a ready seq2seq model (an input when
        it is a local folder)."""
        if self.settings["model"]:
            return local_paths(self.settings["model"])
        return [self.model(wildcards)]

    def model_fingerprint(self, wildcards) -> str:
        """The content of a configured local generator folder (see content_fingerprint)."""
        return content_fingerprint(self.settings["model"])

    def eval_splits(self, wildcards) -> list[str]:
        """Query splits the generator must never train on: every split but the training one."""
        spec = self.collections.spec(wildcards)
        return sorted({spec["eval_split"], "dev", "test"} - {spec["train_split"]})

    def train_flags(self, wildcards) -> str:
        train = schema_flags(self.config, self.schema, "pretrain.doc2query.train")
        return (
            f"--seed {q(self.seed)} {train}"
            f" --eval-splits {' '.join(map(q, self.eval_splits(wildcards)))} {training_flags(self.config, self.schema)}"
        )

    def generate_flags(self, wildcards) -> str:
        # model is an input, input_prefix is quoted below, train is train_doc2query's
        generation = schema_flags(
            self.config,
            self.schema,
            "pretrain.doc2query",
            passed_otherwise=("model", "input_prefix", "train"),
        )
        flags = f"--seed {q(self.seed)} {generation} {precision_flag(self.config)}"
        if self.settings["input_prefix"]:
            flags += f" --input-prefix {shlex.quote(self.settings['input_prefix'])}"
        return flags
