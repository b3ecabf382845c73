"""The methods, one record each: what the rules derive their plan from (issue 53).

A record holds a method's facts that the rules, the comparison and the docs share: the paper and
section it reproduces, whether it pre-trains on each collection (a corpus stage, its encoder at
``<collection>/<method>/pretrain/model``), which generic (stage-one) model it starts from, the
geometry its encoder was pre-trained in, and whether that encoder is a retriever as it is (a
``<method>/zeroshot`` row of its own). The schema's ``methods`` list is these names
(tests/test_plan_methods.py); docs/methods.md says what each method's loss is fed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    reproduces: str
    # stage two: pre-trained on each collection's own text (or pretrain.*.corpus)
    corpus_stage: bool = False
    # the generic stage whose model it starts from (or is, for condenser): the stage-one method
    generic: str | None = None
    # "condenser", "contriever", "mae" or "mlm": the pre-training code it runs (none: fine-tuning only)
    family: str | None = None
    # the pooling its encoder was pre-trained with where not the papers' [CLS] (its fine-tuning
    # starts in it); its similarity is the dot product
    pooling: str | None = None
    # a control: fine-tuned as none, in this (pooling, similarity)
    geometry: tuple[str, str] | None = None
    # fine-tuned in the initial model's geometry, as none (model.pooling, model.similarity, else
    # the model's own): a control whose encoder is the initial model, pre-trained further
    init_geometry: bool = False
    # its pre-trained encoder is a retriever as it is: a <method>/zeroshot row
    zeroshot_row: bool = False
    # query-as-context: the method whose stage and stage-one model it shares
    qac_of: str | None = None
    # its rows fine-tune at its pre-training temperature (pretrain.<name>.temperature) when the
    # fine-tuning section sets none
    pretraining_temperature: bool = False
    # the paper as a pre-trained model's card cites it (models/st_format.py); every method with a
    # pre-training family has one
    citation: str = ""

    @property
    def encoder(self) -> str | None:
        """Where its fine-tuning starts: ``corpus`` (its corpus stage's model), ``generic`` (the
        stage-one model itself: condenser) or None (the initial model)."""
        if self.corpus_stage:
            return "corpus"
        return "generic" if self.generic else None


METHODS = (
    Method("none", "the initial model fine-tuned with no pre-training (every paper's baseline rows)"),
    Method(
        "none-mean",
        "none in Contriever's geometry (mean pooling, dot product): the contriever row's control",
        geometry=("mean", "dot"),
    ),
    Method(
        "mlm",
        "domain-adaptive masked-LM pre-training on the collection's own documents (Gururangan et al."
        " 2020, section 3; GPL, Wang et al. 2022, Table 1's MLM row): the corpus-aware methods' control",
        corpus_stage=True,
        family="mlm",
        init_geometry=True,
        citation="domain-adaptive pre-training with BERT's masked language model (Gururangan et al., ACL 2020, 'Don't Stop Pretraining: Adapt Language Models to Domains and Tasks', section 3)",
    ),
    Method(
        "condenser",
        "Condenser (Gao and Callan 2021) section 3.3, eq. 9-11",
        generic="condenser",
        family="condenser",
        citation="Condenser (Gao & Callan, EMNLP 2021, 'Condenser: a Pre-training Architecture for Dense Retrieval')",
    ),
    Method(
        "cocondenser",
        "coCondenser (Gao and Callan 2022) sections 3.2-3.3, eq. 6-12",
        corpus_stage=True,
        generic="condenser",
        family="condenser",
        citation="coCondenser (Gao & Callan, ACL 2022, 'Unsupervised Corpus Aware Language Model Pre-training for Dense Passage Retrieval')",
    ),
    Method(
        "contriever",
        "Contriever (Izacard et al. 2022) section 3, Appendix A",
        corpus_stage=True,
        family="contriever",
        pooling="mean",
        zeroshot_row=True,
        pretraining_temperature=True,  # Appendix A: "a temperature of 0.05, also used during pretraining"
        citation="Contriever (Izacard et al., TMLR 2022, 'Unsupervised Dense Information Retrieval with Contrastive Learning')",
    ),
    Method(
        "bmae",
        "CDMAE paper section 3.1 (the bottlenecked MAE)",
        corpus_stage=True,
        generic="bmae",
        family="mae",
        citation="bottlenecked masked auto-encoder, the baseline of CDMAE ('Challenging Decoder helps in Masked Auto-Encoder Pre-training for Dense Passage Retrieval', section 3.1)",
    ),
    Method(
        "cdmae",
        "CDMAE (Li et al.) section 3.2, Algorithm 1",
        corpus_stage=True,
        generic="cdmae",
        family="mae",
        citation="CDMAE ('Challenging Decoder helps in Masked Auto-Encoder Pre-training for Dense Passage Retrieval', section 3.2)",
    ),
    Method(
        "cotmae",
        "CoT-MAE; query-as-context paper section 2.2",
        corpus_stage=True,
        generic="cotmae",
        family="mae",
        citation="CoT-MAE (Wu et al., AAAI 2023, 'ConTextual Masked Auto-Encoder for Dense Passage Retrieval'), as in query-as-context section 2.2",
    ),
    Method(
        "qac-cocondenser",
        "query-as-context (Wu et al. 2023) sections 3.2, 4.1",
        corpus_stage=True,
        generic="condenser",
        family="condenser",
        qac_of="cocondenser",
        citation="query-as-context pre-training on coCondenser (Wu et al., EMNLP 2023, 'Query-as-context Pre-training for Dense Passage Retrieval', section 3.2)",
    ),
    Method(
        "qac-cotmae",
        "query-as-context (Wu et al. 2023) section 3.2",
        corpus_stage=True,
        generic="cotmae",
        family="mae",
        qac_of="cotmae",
        citation="query-as-context pre-training on CoT-MAE (Wu et al., EMNLP 2023, 'Query-as-context Pre-training for Dense Passage Retrieval', section 3.2)",
    ),
)
BY_NAME = {m.name: m for m in METHODS}

# What the rules read, derived from the records.
ZEROSHOT_METHODS = [m.name for m in METHODS if m.zeroshot_row]
PRETRAINED_POOLING = {m.name: m.pooling for m in METHODS if m.pooling}
GEOMETRY_CONTROLS = {m.name: m.geometry for m in METHODS if m.geometry}
CORPUS_PRETRAINED = [m.name for m in METHODS if m.corpus_stage]
MAE_METHODS = [m.name for m in METHODS if m.family == "mae" and not m.qac_of]
# every method that runs the MAE stage, and every method of coCondenser's corpus stage
MAE_STAGE_METHODS = [m.name for m in METHODS if m.family == "mae"]
COCONDENSER_STAGE_METHODS = [m.name for m in METHODS if m.family == "condenser" and m.corpus_stage]
QAC_METHODS = {m.name: m.qac_of for m in METHODS if m.qac_of}
