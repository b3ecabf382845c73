# DAG helpers that several families of rules share: paths, config sections, method lists and
# cluster-request estimates. A family's own helpers (input functions, flags, resources) live in
# rules/functions/<family>.smk, its rules in rules/<family>.smk (snakemake --lint: no file mixes
# rules and functions). The flag strings are built by dprflow.rule_flags, where ruff and the unit
# tests read them. No rule lives here.
#
# The flags of a rule's params are functions of the wildcards only, never of `input`: Snakemake
# leaves params that take `input` out of its params-changed rerun trigger (snakemake issue 3895),
# so a changed setting would not rerun the job. They rebuild the input paths they name instead.

import copy
import json
import os
import shlex
from pathlib import Path

from dprflow.finetuning.selection import grid_points, point_name
from dprflow.plan import rows as plan_rows
from dprflow.plan.methods import BY_NAME as METHOD_RECORDS
from dprflow.plan.methods import (
    COCONDENSER_STAGE_METHODS,
    CORPUS_PRETRAINED,
    GEOMETRY_CONTROLS,
    MAE_METHODS,
    MAE_STAGE_METHODS,
    PRETRAINED_POOLING,
    QAC_METHODS,
    ZEROSHOT_METHODS,
)
from dprflow.plan.rows import STAGES, is_dense, split_transfer
from dprflow.models.init import MLM_INIT
from dprflow.plan.resources import ResourceEstimates, training_launcher
from dprflow.plan.pretrain import (
    TOKEN_VIEWS,
    PretrainPlan,
    content_fingerprint,
    local_paths,
)
from dprflow.rule_flags import (
    RESOURCE_SETTINGS,
    generic_corpus_flags,
    optim_flags,
    precision_flag,
    q,
    schema_flags,
    training_flags,
)
from dprflow.stage_code import stage_sources

# The stage modules run as `python -m dprflow.stages.<rule>`; the shell prefix makes the package
# importable in every job (local, conda or cluster) without requiring it to be installed.
SRC = f"{workflow.basedir}/src"
PYTHONPATH = os.pathsep.join(p for p in (SRC, os.getenv("PYTHONPATH")) if p)
shell.prefix(f"export PYTHONPATH={shlex.quote(PYTHONPATH)}; ")

RESULTS = "results"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
# The methods' facts, one record each (dprflow.plan.methods): which have a zeroshot row of their
# own (Contriever's unsupervised setting), the pooling a pre-trained encoder was trained with where
# not [CLS] (Contriever section 3: the mean; its folder carries no sentence-transformers
# configuration, so this is the "initial model's own" geometry of its fine-tuning), the geometry
# controls (none-mean: none in Contriever's geometry; none itself takes model.pooling and
# model.similarity), which pre-train on each collection, the MAEs, the query-as-context methods.


# The off-the-shelf models of model.references: row method ref-<name> -> model, pooling, similarity.
REFERENCES = reference_models(config)
NAME = plan_rows.NAME
# A row scored on another collection than the one it was trained on: <row>/on-<collection>, in the
# training collection's folder (transfer evaluation, collections.<name>.evaluate_on / evaluate_only).
TRANSFER_SUFFIX = plan_rows.transfer_pattern()


wildcard_constraints:
    collection=f"(?!pretrain$){NAME}",
    method=NAME,
    target=NAME,
    # a row's name (dprflow.plan.rows): bm25, <method>/zeroshot or <method>/seed-<seed>/<stage>,
    # fused with BM25 or not, with /on-<collection> when scored on another collection (transfer)
    system=plan_rows.system_pattern(),


def result_path(*parts):
    """A path under results/ from its parts (wildcard values among them): for the input functions,
    whose paths never reach a shell line unquoted."""
    return "/".join([RESULTS, *map(str, parts)])


# The initial model, resolved here once: every rule that starts from model.init reads INIT.
# model.init mlm names the MLM base (a BERT pre-trained here from random weights with BERT's
# masked language model, rule pretrain_mlm), whose folder is MLM_MODEL; the rules that only
# tokenize (split_passages, the token stores) read its vocabulary, INIT_TOKENIZER
# (model.mlm.tokenizer), so they do not wait for its training.
MLM_MODEL = f"{RESULTS}/pretrain/mlm/model"
MLM_BASE = config["model"]["init"] == MLM_INIT
INIT = MLM_MODEL if MLM_BASE else config["model"]["init"]
INIT_TOKENIZER = config["model"]["mlm"]["tokenizer"] if MLM_BASE else INIT


def init_input(model):
    """The inputs that ``model``, a job's starting model, gives it. The MLM base always (a job's
    output, an input before it exists); another only when it is a local folder (a hub id or a
    packaged model's name is no file)."""
    return [model] if model == MLM_MODEL else local_paths(model)


def init_fingerprint_of(model):
    """The content of a model a rule starts from (content_fingerprint); none for the MLM base, a
    rule's output, whose changes Snakemake tracks itself."""
    return "" if model == MLM_MODEL else content_fingerprint(model)


def model_init_input(wildcards):
    """The initial model (INIT) when it is the MLM base or a local folder: an input of every rule
    that reads it."""
    return init_input(INIT)


def tokenizer_init_input(wildcards):
    """The initial model's tokenizer (INIT_TOKENIZER) when it is a local folder."""
    return local_paths(INIT_TOKENIZER)


def model_init_fingerprint(wildcards):
    return init_fingerprint_of(INIT)


def tokenizer_init_fingerprint(wildcards):
    return content_fingerprint(INIT_TOKENIZER)


def stage_code(name):
    """The stage module's file and those of every dprflow module it imports (dprflow.stage_code):
    inputs of its rule, so editing the stage or any module it runs (a loss, the trainer) reruns it.
    """
    return stage_sources(name, SRC)


def collection_spec(wildcards):
    """A collection's config, or a pre-training corpus's (pretrain.corpora: ingested alike)."""
    name = wildcards.collection
    if name in config["collections"]:
        return config["collections"][name]
    return config["pretrain"]["corpora"][name]


def eval_split(wildcards):
    return collection_spec(wildcards)["eval_split"]


def train_split(wildcards):
    return collection_spec(wildcards)["train_split"]


def scored_collection(wildcards):
    """The collection a row's run is scored on: its ``target`` wildcard or ``/on-<collection>``
    suffix (transfer), else the collection it lives in."""
    target = getattr(wildcards, "target", None)
    for key in ("system", "retriever"):
        value = getattr(wildcards, key, None)
        if value is not None and target is None:
            target = split_transfer(value)[1]
    return target or wildcards.collection


def of_scored_collection(path):
    """An input function: ``path``, a pattern of ``{collection}`` (a rule's output), for the
    collection the row is scored on (its own for a row scored where it was trained)."""

    def resolved(wildcards):
        return str(path).replace("{collection}", scored_collection(wildcards))

    return resolved


def scored_eval_split(wildcards):
    return config["collections"][scored_collection(wildcards)]["eval_split"]


def training_collections():
    """Collections that train rows (every one not marked evaluate_only)."""
    return [c for c, spec in config["collections"].items() if not spec["evaluate_only"]]


def transfer_targets(collection):
    """The other collections the rows trained on ``collection`` are scored on: its evaluate_on,
    then every evaluate-only collection."""
    spec = config["collections"][collection]
    evaluate_only = [c for c, s in config["collections"].items() if s["evaluate_only"]]
    return [
        c for c in dict.fromkeys(spec["evaluate_on"] + evaluate_only) if c != collection
    ]


def finetune_seeds():
    """The fine-tuning seeds: the top-level seeds list, else finetune.seed alone."""
    return config["seeds"] or [config["finetune"]["seed"]]


def untrained_rows():
    """Rows that train nothing on the collection: BM25, the initial model and each reference model
    off the shelf; every collection scores its own."""
    return [plan_rows.BM25, plan_rows.OFF_THE_SHELF] + [
        plan_rows.zeroshot(r) for r in REFERENCES
    ]


def method_stages(method):
    """The fine-tuned rows of ``method`` (finetune.stages_of, else finetune.stages), in the
    pipeline's order."""
    chosen = config["finetune"]["stages_of"].get(method, config["finetune"]["stages"])
    return [stage for stage in STAGES if stage in chosen]


def trained_rows():
    """Rows trained on a collection: a method's pre-trained encoder as it is (Contriever) and each
    method's fine-tuning stages once per seed (<method>/seed-<seed>/<stage>)."""
    rows = [plan_rows.zeroshot(m) for m in config["methods"] if m in ZEROSHOT_METHODS]
    for method in config["methods"]:
        for seed in finetune_seeds():
            rows += [plan_rows.trained(method, seed, s) for s in method_stages(method)]
    return rows


def fused_rows():
    """The dense rows fused with BM25 (finetune.fusion.rows), <row>+bm25: the model off the shelf
    (and a method's own zeroshot row) and each method's fine-tuned rows named there."""
    chosen = config["finetune"]["fusion"]["rows"]
    rows = []
    if plan_rows.ZEROSHOT in chosen:
        rows += [
            plan_rows.zeroshot(m)
            for m in ["none", *(m for m in config["methods"] if m in ZEROSHOT_METHODS)]
        ]
    for method in config["methods"]:
        for seed in finetune_seeds():
            rows += [
                plan_rows.trained(method, seed, s)
                for s in method_stages(method)
                if s in chosen
            ]
    return [plan_rows.fused(row) for row in rows]


def systems():
    """Every row of a training collection, scored on it."""
    return untrained_rows() + trained_rows() + fused_rows()


def scored_rows():
    """(folder collection, system) of every evaluated row: each collection's own rows (an
    evaluate-only collection's: the untrained ones), then each training collection's trained rows
    scored on its transfer targets (<row>/on-<target>, in the training collection's folder).
    """
    rows = []
    for c, spec in config["collections"].items():
        rows += [
            (c, s) for s in (untrained_rows() if spec["evaluate_only"] else systems())
        ]
    for c in training_collections():
        rows += [
            (c, plan_rows.transfer(s, t))
            for t in transfer_targets(c)
            for s in trained_rows()
        ]
    return rows


def comparison_rows():
    """The rows of the comparison: each system with its seed folded away (<method>/<stage>)."""
    names = (split_transfer(s)[0] for _, s in scored_rows())
    return list(dict.fromkeys(plan_rows.without_seed(s) for s in names))


# The baseline must be one of them: checked now, not when the comparison is made.
check_baseline(config, comparison_rows())


# ---- config sections and method families --------------------------------------------------------

FT = config["finetune"]


# an encoder whose corpus is encoded and searched: zeroshot, or seed-<seed>/<trained>
TRAINED_RETRIEVER = "seed-[0-9]+/(r1|r2|distill)"
# a point of finetune.select's grid: retriever 1 trained on the fit part of the training queries
# (dprflow.finetuning.selection.point_name)
POINT = "[A-Za-z0-9_.=,-]+"
SELECT_RETRIEVER = f"seed-[0-9]+/select/{POINT}"
NATIVE_RETRIEVER = f"zeroshot|{TRAINED_RETRIEVER}|{SELECT_RETRIEVER}"
# searched for the held-out training queries (the selection): a grid point, or the model off the
# shelf (its fusion weight)
HELDOUT_RETRIEVER = f"zeroshot|{SELECT_RETRIEVER}"
# searched for its evaluation queries only (no training run to mine): zeroshot, or a transfer
EVAL_ONLY_RETRIEVER = f"zeroshot|({NATIVE_RETRIEVER})/on-{NAME}"


wildcard_constraints:
    # ... with /on-<collection> when it encodes another collection's corpus (transfer)
    retriever=f"({NATIVE_RETRIEVER}){TRANSFER_SUFFIX}",
    trained=f"r1|r2|distill|select/{POINT}",
    seed="[0-9]+",
    shard="[0-9]+",


PT = config["pretrain"]


def condenser_model():
    """The stage-one Condenser (coCondenser stage two's start and the condenser row's encoder):
    pretrain.cocondenser.init (coCondenser 4.1: "the released Condenser"), else the model
    pretrain_generic trains here."""
    return PT["cocondenser"]["init"] or f"{RESULTS}/pretrain/condenser/generic/model"


def condenser_input(wildcards):
    """The stage-one Condenser as an input (of coCondenser's stage two and the condenser row's
    retrievers): pretrain.cocondenser.init when it is a local folder (a hub id is no input), else
    the model pretrain_generic trains here."""
    init = PT["cocondenser"]["init"]
    return local_paths(init) if init else [condenser_model()]


def condenser_stage_one():
    """Stage one's model folder when pretrain_generic trains it here; none when stage two starts
    from pretrain.cocondenser.init."""
    return [] if PT["cocondenser"]["init"] else [condenser_model()]


wildcard_constraints:
    mae="|".join(MAE_METHODS),
    mae_method="|".join(MAE_STAGE_METHODS),
    cocondenser="|".join(COCONDENSER_STAGE_METHODS),
    corpus="[A-Za-z0-9_-]+",


# What jobs ask a cluster for (memory, runtime) and how a training job starts: dprflow.plan.resources.
RESOURCES = ResourceEstimates(config)

# The pre-training rules' inputs and flags: dprflow.plan.pretrain.
PRETRAIN = PretrainPlan(config, SCHEMA, RESULTS, INIT_TOKENIZER)
