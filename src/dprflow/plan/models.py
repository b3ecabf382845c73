"""The models a job starts from, resolved once from the config: the initial model (``model.init``,
or the MLM base trained here), its tokenizer, the stage-one Condenser, each method's pre-trained
encoder, the reranker's start, the geometry (pooling, similarity) each is used in, and what each
gives its job as inputs (a local folder or a rule's output; a hub id or a packaged model's name
is no file) and as a content fingerprint (a param, so that an edited local folder reruns).

The rules hold one :class:`ModelPlan` (rules/common.smk, ``MODELS``) and name its methods as input
and params functions; those that take ``wildcards`` are such functions.
"""

from __future__ import annotations

from typing import Any

from dprflow.plan import UnderResults, rows
from dprflow.plan.methods import BY_NAME, GEOMETRY_CONTROLS, PRETRAINED_POOLING
from dprflow.plan.pretrain import content_fingerprint, local_paths


class ModelPlan(UnderResults):
    """``references``: model.references as dprflow.config.reference_models gives them (row method
    -> model, pooling, similarity); ``mlm_base``: whether model.init names the MLM base."""

    def __init__(self, config: dict, results: str, references: dict[str, dict[str, Any]], mlm_base: bool):
        self.model = config["model"]
        self.pretrain = config["pretrain"]
        self.finetune = config["finetune"]
        self.results = results
        self.references = references
        # model.init mlm names the MLM base (a BERT pre-trained here from random weights, rule
        # pretrain_mlm); the rules that only tokenize read its vocabulary (model.mlm.tokenizer),
        # so they do not wait for its training.
        self.mlm_base = mlm_base
        self.mlm_model = self.path("pretrain", "mlm", "model")
        self.init = self.mlm_model if mlm_base else self.model["init"]
        self.init_tokenizer = self.model["mlm"]["tokenizer"] if mlm_base else self.init

    # ---- a starting model as an input and a fingerprint ---------------------------------------

    def init_input(self, model: str) -> list[str]:
        """The inputs that ``model``, a job's starting model, gives it: the MLM base always (a
        job's output, an input before it exists); another only when it is a local folder."""
        return [model] if model == self.mlm_model else local_paths(model)

    def init_fingerprint_of(self, model: str) -> str:
        """The content of a model a rule starts from (content_fingerprint); none for the MLM base,
        a rule's output, whose changes Snakemake tracks itself."""
        return "" if model == self.mlm_model else content_fingerprint(model)

    def model_init_input(self, wildcards=None) -> list[str]:
        """The initial model when it is the MLM base or a local folder: an input of every rule
        that reads it."""
        return self.init_input(self.init)

    def model_init_fingerprint(self, wildcards=None) -> str:
        return self.init_fingerprint_of(self.init)

    def tokenizer_init_input(self, wildcards=None) -> list[str]:
        """The initial model's tokenizer when it is a local folder."""
        return local_paths(self.init_tokenizer)

    def tokenizer_init_fingerprint(self, wildcards=None) -> str:
        return content_fingerprint(self.init_tokenizer)

    # ---- the stage-one Condenser -------------------------------------------------------------

    def condenser_model(self) -> str:
        """The stage-one Condenser (coCondenser stage two's start and the condenser row's
        encoder): pretrain.cocondenser.init (coCondenser 4.1: "the released Condenser"), else the
        model pretrain_generic trains here."""
        return self.pretrain["cocondenser"]["init"] or self.path("pretrain", "condenser", "generic", "model")

    def condenser_input(self, wildcards=None) -> list[str]:
        """The stage-one Condenser as an input: pretrain.cocondenser.init when it is a local folder
        (a hub id is no input), else the model pretrain_generic trains here."""
        init = self.pretrain["cocondenser"]["init"]
        return local_paths(init) if init else [self.condenser_model()]

    def condenser_stage_one(self) -> list[str]:
        """Stage one's model folder when pretrain_generic trains it here; none when stage two
        starts from pretrain.cocondenser.init."""
        return [] if self.pretrain["cocondenser"]["init"] else [self.condenser_model()]

    # ---- what a method's fine-tuning starts from ---------------------------------------------

    @staticmethod
    def encoder_is_stage_one(method: str) -> bool:
        """The method fine-tunes the stage-one Condenser itself (condenser: no corpus stage)."""
        record = BY_NAME.get(method)
        return record is not None and record.encoder == "generic"

    def pretrained_encoder(self, wildcards) -> list[str]:
        """The pre-trained encoder folder of a method (an input of its retrievers); none for
        method none or a reference row."""
        if self.encoder_is_stage_one(wildcards.method):
            return self.condenser_input()
        record = BY_NAME.get(wildcards.method)
        if record is not None and record.corpus_stage:
            return [self.path(wildcards.collection, wildcards.method, "pretrain", "model")]
        return []

    def method_init(self, wildcards) -> str:
        """The checkpoint a method's fine-tuning starts from (method none: the initial model; a
        reference row ref-<name>: its model)."""
        if self.encoder_is_stage_one(wildcards.method):
            return self.condenser_model()
        encoder = self.pretrained_encoder(wildcards)
        if encoder:
            return encoder[0]
        if wildcards.method in self.references:
            return self.references[wildcards.method]["model"]
        return self.init

    def init_fingerprint(self, wildcards) -> str:
        """The content of the user's folder a job starts from: model.init for the retrievers of
        method none, pretrain.cocondenser.init for the condenser row's; among dense rows only the
        zeroshot one reads it."""
        if rows.split_transfer(getattr(wildcards, "retriever", rows.ZEROSHOT))[0] != rows.ZEROSHOT:
            return ""
        if wildcards.method in self.references:
            return content_fingerprint(self.references[wildcards.method]["model"])
        if self.encoder_is_stage_one(wildcards.method):
            return content_fingerprint(self.pretrain["cocondenser"]["init"])
        if self.pretrained_encoder(wildcards):
            return ""
        return self.model_init_fingerprint()

    def initial_geometry(self, method: str) -> tuple[str | None, str | None]:
        """(pooling, similarity) of a method's initial model where the config or the method fixes
        them; None leaves the stage to read the model's own (model.init: its sentence-transformers
        configuration, else cls and dot)."""
        record = BY_NAME.get(method)
        if method == "none" or (record is not None and record.init_geometry):
            return self.model["pooling"], self.model["similarity"]
        if method in GEOMETRY_CONTROLS:
            return GEOMETRY_CONTROLS[method]
        if method in self.references:
            return self.references[method]["pooling"], self.references[method]["similarity"]
        return PRETRAINED_POOLING.get(method), None

    def finetune_geometry(self, method: str) -> tuple[str | None, str | None]:
        """Fine-tuning's pooling and similarity: finetune.* where set, else the initial model's."""
        pooling, similarity = self.initial_geometry(method)
        return self.finetune["pooling"] or pooling, self.finetune["similarity"] or similarity

    # ---- the reranker's start ----------------------------------------------------------------

    def reranker_init(self) -> str:
        """finetune.reranker.init, else the initial model."""
        return self.finetune["reranker"]["init"] or self.init

    def reranker_init_input(self, wildcards=None) -> list[str]:
        """The reranker's initial model when it is the MLM base or a local folder."""
        return self.init_input(self.reranker_init())

    def reranker_init_fingerprint(self, wildcards=None) -> str:
        return self.init_fingerprint_of(self.reranker_init())

    def reranker_pooling(self) -> str | None:
        """The cross-encoder head's pooling: as configured, else model.pooling when the reranker
        starts from model.init; None leaves the stage to take the initial model's own (its
        sentence-transformers pooling: mean for all-MiniLM-L6-v2), else BERT's [CLS] pooler."""
        r = self.finetune["reranker"]
        return r["pooling"] or (None if r["init"] else self.model["pooling"])
