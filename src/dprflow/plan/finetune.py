"""The fine-tuning pipeline's plan: what each retriever, encoding, search and reranker job reads
and the flags it runs with (finetune.*; docs/training.md).

The rules hold one :class:`FinetunePlan` (rules/common.smk, ``FINETUNE``) and name its methods as
input, params and resources functions; those that take ``wildcards`` are such functions. The
flags are functions of the wildcards only, never of ``input`` (see the note at the top of
rules/common.smk).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dprflow.plan import UnderResults, rows
from dprflow.plan.methods import BY_NAME
from dprflow.plan.models import ModelPlan
from dprflow.plan.resources import ResourceEstimates
from dprflow.plan.run_rows import RunRows
from dprflow.plan.selection import SelectionPlan
from dprflow.rule_flags import optim_flags, precision_flag, q, training_flags


def geometry_flags(pooling: str | None, similarity: str | None) -> str:
    """--pooling/--similarity where set; a stage takes the model's own for those left out."""
    flags = [f"--{k} {q(v)}" for k, v in (("pooling", pooling), ("similarity", similarity)) if v]
    return "".join(f" {f}" for f in flags)


def native_retriever(wildcards) -> str:
    """The retriever without its transfer suffix: the model is the same whatever it encodes."""
    return rows.split_transfer(wildcards.retriever)[0]


def run_tag(wildcards) -> str:
    """The TREC run tag of a dense run: method, seed and stage, e.g. none-seed-13-r2
    (none-seed-13-r2-on-cisi)."""
    return "-".join([wildcards.method, *Path(wildcards.retriever).parts])


class FinetunePlan(UnderResults):
    def __init__(
        self,
        config: dict,
        schema: str,
        results: str,
        models: ModelPlan,
        selection: SelectionPlan,
        resources: ResourceEstimates,
        run_rows: RunRows,
    ):
        self.config, self.schema, self.results = config, schema, results
        self.finetune = config["finetune"]
        self.pretrain = config["pretrain"]
        self.models, self.selection, self.resources, self.rows = models, selection, resources, run_rows

    # ---- encoding and search -----------------------------------------------------------------

    def shards(self) -> list[int]:
        return list(range(self.finetune["encode_shards"]))

    def encoder_inputs(self, wildcards) -> list[str] | str:
        """The trained model folder of a retriever; for a zeroshot row, the method's pre-trained
        encoder, or the off-the-shelf model where it is a local folder."""
        retriever = native_retriever(wildcards)
        if retriever == rows.ZEROSHOT:
            models = self.models
            return models.pretrained_encoder(wildcards) or models.init_input(models.method_init(wildcards))
        return self.path(wildcards.collection, wildcards.method, retriever, "model")

    def encoder_flags(self, wildcards) -> str:
        """The encoder of a dense run and its precision (passages, and queries unless the
        embeddings record theirs): a zeroshot row's initial model as it ships (or as model.* says),
        else the trained folder with the geometry it was trained with."""
        retriever = native_retriever(wildcards)
        if retriever == rows.ZEROSHOT:
            geometry = geometry_flags(*self.models.initial_geometry(wildcards.method))
            model = f"--model {q(self.models.method_init(wildcards))}{geometry}"
        else:
            model = f"--model {q(self.path(wildcards.collection, wildcards.method, retriever, 'model'))}"
        return f"{model} {precision_flag(self.config)}"

    def search_flags(self, wildcards) -> str:
        """The encoder's flags, and --shard-at-a-time where finetune.search_shard_at_a_time is set
        (left out when not, so a default run's command line is the one before the key existed)."""
        flags = self.encoder_flags(wildcards)
        if self.finetune["search_shard_at_a_time"]:
            flags += " --shard-at-a-time true"
        return flags

    def embedding_shards(self, wildcards) -> list[str]:
        base = self.path(wildcards.collection, wildcards.method, wildcards.retriever)
        return [f"{base}/embeddings/shard_{s}.parquet" for s in self.shards()]

    def embeddings_pattern(self) -> str:
        """A shard of corpus embeddings, as a rule's output pattern."""
        return self.path("{collection}", "{method}", "{retriever}", "embeddings", "shard_{shard}.parquet")

    def faiss_index_dirs(self) -> list[str]:
        """The pyserini FaissSearcher folder of every dense row, when finetune.faiss_index is on."""
        if not self.finetune["faiss_index"]:
            return []
        return [
            self.path(c, row, "faiss")
            for c, row in self.rows.scored()
            if rows.is_dense(row) and rows.split_transfer(row)[1] is None
        ]

    def train_depth(self) -> int:
        """Training-query runs feed mining (K2) and the reranker (K3)."""
        return max(self.finetune["mining_depth"], self.finetune["reranker"]["depth"])

    def mining_depth(self, wildcards) -> int:
        """K2 for retriever 2's pools (mined by r1, or by the chosen retriever point on the fit
        part), K3 for the reranker's (mined by r2)."""
        if wildcards.trained in ("r1", "select"):
            return self.finetune["mining_depth"]
        return self.finetune["reranker"]["depth"]

    # ---- training a retriever ----------------------------------------------------------------

    def role(self, wildcards) -> str:
        """The stage a trained retriever is: its own (r1, r2, distill), or for a grid point the
        stage its grid chooses for (the retriever's r1, the negatives' r2, the distillation's)."""
        if self.selection.is_point(wildcards):
            return "r1"
        if self.selection.is_negatives_point(wildcards):
            return "r2"
        if self.selection.is_distill_point(wildcards):
            return "distill"
        return wildcards.trained

    def retriever_section(self, wildcards) -> dict[str, Any]:
        """The config section a trained retriever's settings come from (a grid point's: the
        retriever's with the point's settings over it)."""
        if self.role(wildcards) == "distill":
            return {**self.finetune["distill"], **self.selection.distill_point_settings(wildcards)}
        if self.selection.is_point(wildcards):
            return {**self.finetune["retriever"], **self.selection.point_settings(wildcards)}
        return self.finetune["retriever"]

    def retriever_inputs(self, wildcards) -> dict[str, str]:
        """The pre-trained encoder, negative pools (and teacher scores) of each trained retriever."""
        base = self.path(wildcards.collection)
        method = self.path(wildcards.collection, wildcards.method, rows.seed_folder(wildcards.seed))
        out = {}
        encoder = self.models.pretrained_encoder(wildcards) or self.models.model_init_input()
        if encoder:
            out["encoder"] = encoder[0]
        role, on_fit = self.role(wildcards), self.selection.trains_on_fit(wildcards)
        if role == "r1":
            out["negatives"] = f"{base}/bm25/negatives.parquet"
        elif role == "r2":
            out["negatives"] = (
                self.selection.fit_negatives(wildcards) if on_fit else f"{method}/r1/negatives.parquet"
            )
            # BM25's pool beside the mined one: drawn from at the configured or chosen share
            if (
                self.extra_fraction(wildcards) > 0
                or on_fit
                or self.selection.selects_negatives(wildcards.method)
            ):
                out["extra"] = f"{base}/bm25/negatives.parquet"
        elif on_fit:  # a distillation point: the fit part's pool and teacher
            out["negatives"] = self.selection.fit_negatives(wildcards)
            out["teacher"] = self.selection.fit_teacher(wildcards)
        else:
            out["negatives"] = f"{method}/r2/negatives.parquet"
            out["teacher"] = f"{method}/rerank/teacher_scores.parquet"
        return out

    def extra_fraction(self, wildcards) -> float:
        """Retriever 2's share of BM25 negatives: a negatives' grid point's, else the configured
        one (which a chosen mix replaces in the stage, --selection)."""
        point = self.selection.negatives_point_settings(wildcards)
        return point.get("r2_bm25_fraction", self.finetune["r2_bm25_fraction"])

    def retriever_flags(self, wildcards) -> str:
        """Hyper-parameters of one trained retriever (distillation has its own section)."""
        inputs = self.retriever_inputs(wildcards)
        role = self.role(wildcards)
        ft = self.finetune
        common = (
            f"--method {q(wildcards.method)} --role {q(role)}"
            + geometry_flags(*self.models.finetune_geometry(wildcards.method))
            + f" --shared {q(str(ft['shared_encoder']).lower())} --seed {q(wildcards.seed)}"
            f" --max-query-length {q(ft['max_query_length'])} --max-passage-length {q(ft['max_passage_length'])}"
        )
        section = self.retriever_section(wildcards)
        flags = self.selection.selection_flag(wildcards)
        if role == "distill":
            flags += (
                f" --teacher {q(inputs['teacher'])} --alpha {q(section['alpha'])}"
                f" --direction {q(section['direction'])} --student-over {q(section['student_over'])}"
            )
        # null: the similarity's default (1 dot, 0.05 cosine), but Contriever's rows fine-tune at
        # "a temperature of 0.05, also used during pretraining" (Contriever Appendix A)
        temperature = section["temperature"]
        record = BY_NAME.get(wildcards.method)
        if temperature is None and record and record.pretraining_temperature:
            temperature = self.pretrain[wildcards.method]["temperature"]
        if temperature is not None:
            flags += f" --temperature {q(temperature)}"
        if "extra" in inputs:
            flags += f" --extra-negatives {q(inputs['extra'])} --extra-fraction {q(self.extra_fraction(wildcards))}"
        return (
            f"{common}{flags}{optim_flags(section)} --chunk-size {q(section['chunk_size'])}"
            f" {training_flags(self.config, self.schema)}"
        )

    def train_retriever_mem_mb(self, wildcards) -> int:
        return self.resources.training(self.retriever_section(wildcards), wildcards.collection)[0]

    def train_retriever_runtime(self, wildcards) -> int:
        return self.resources.training(self.retriever_section(wildcards), wildcards.collection)[1]

    # ---- the reranker ------------------------------------------------------------------------

    def reranker_section(self, wildcards) -> dict[str, Any]:
        """The reranker's settings (a grid point's: the section with the point's over it)."""
        return {**self.finetune["reranker"], **self.selection.reranker_point_settings(wildcards)}

    def reranker_flags(self, wildcards) -> str:
        r = self.reranker_section(wildcards)
        pooling = self.models.reranker_pooling()
        return (
            (f"--pooling {q(pooling)} " if pooling else "")
            + f"--method {q(wildcards.method)}"
            + optim_flags(r)
            + f" --max-length {q(r['max_length'])} --head-learning-rate {q(r['head_learning_rate'])}"
            + f" --chunk-size {q(r['chunk_size'])}"
            + f" --seed {q(wildcards.seed)}"
            + self.selection.reranker_selection_flag(wildcards)
            + f" {training_flags(self.config, self.schema)}"
        )

    def scoring_flags(self, wildcards) -> str:
        """A teacher's labelling: its precision, and on the fit part the reranker grid's choice."""
        return precision_flag(self.config) + self.selection.teacher_flags(wildcards)

    def train_reranker_mem_mb(self, wildcards) -> int:
        return self.resources.training(self.reranker_section(wildcards), wildcards.collection)[0]

    def train_reranker_runtime(self, wildcards) -> int:
        return self.resources.training(self.reranker_section(wildcards), wildcards.collection)[1]
