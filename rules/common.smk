# What the rules share: paths, config sections, wildcard patterns and the plan's objects
# (dprflow.plan: ROWS the rows a run scores, COLLECTIONS each collection's settings and where a row
# is scored, MODELS the models jobs start from, PRETRAIN, DOC2QUERY, SELECTION and FINETUNE each
# family's inputs and flags, REPORT what the comparison and the report read, RESOURCES what jobs
# ask a cluster for), whose methods the rules name as input, params and resources functions; ruff
# and the unit tests read them there. Two helpers bound to Snakemake or to two plan objects stay
# in rules/functions/ (embeddings_output's temp(), fit_or_training_split); no file mixes rules and
# functions (snakemake --lint). No rule lives here.
#
# The flags of a rule's params are functions of the wildcards only, never of `input`: Snakemake
# leaves params that take `input` out of its params-changed rerun trigger (snakemake issue 3895),
# so a changed setting would not rerun the job. They rebuild the input paths they name instead.

import copy
import json
import os
import shlex

from dprflow.finetuning.selection import SECTION_KEYS as SELECT_SECTIONS
from dprflow.finetuning.selection import grid_points, point_name
from dprflow.plan import rows as plan_rows
from dprflow.plan.methods import BY_NAME as METHOD_RECORDS
from dprflow.plan.methods import (
    COCONDENSER_STAGE_METHODS,
    MAE_METHODS,
    MAE_STAGE_METHODS,
)
from dprflow.plan.rows import STAGES, is_dense, split_transfer
from dprflow.models.init import MLM_INIT
from dprflow.plan.collections import CollectionPlan
from dprflow.plan.doc2query import Doc2QueryPlan
from dprflow.plan.finetune import FinetunePlan, run_tag
from dprflow.plan.models import ModelPlan
from dprflow.plan.run_rows import RunRows
from dprflow.plan.selection import (
    DISTILL_GRID,
    NEGATIVES_GRID,
    RERANKER_GRID,
    SelectionPlan,
)
from dprflow.plan.report import ReportPlan, compare_results_dir, report_results_dir
from dprflow.plan.resources import ResourceEstimates, training_launcher
from dprflow.plan.pretrain import (
    TOKEN_VIEWS,
    PretrainPlan,
    content_fingerprint,
    local_paths,
)
from dprflow.rule_flags import (
    RESOURCE_SETTINGS,
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
# The off-the-shelf models of model.references: row method ref-<name> -> model, pooling, similarity.
REFERENCES = reference_models(config)
NAME = plan_rows.NAME
# A row scored on another collection than the one it was trained on: <row>/on-<collection>, in the
# training collection's folder (transfer evaluation, collections.<name>.evaluate_on / evaluate_only).
TRANSFER_SUFFIX = plan_rows.transfer_pattern()
# The folders of the row grammar (dprflow.plan.rows), as output patterns: one fine-tuning seed's
# (seed-<seed>) and a row's scores on another collection (on-<target>).
SEED_DIR = plan_rows.seed_folder("{seed}")
TRANSFER_DIR = plan_rows.transfer_folder("{target}")
SEED_PATTERN = plan_rows.seed_folder("[0-9]+")


wildcard_constraints:
    collection=f"(?!pretrain$){NAME}",
    method=NAME,
    target=NAME,
    # a row's name (dprflow.plan.rows): bm25, <method>/zeroshot or <method>/seed-<seed>/<stage>,
    # fused with BM25 or not, with /on-<collection> when scored on another collection (transfer)
    system=plan_rows.system_pattern(),


# The models jobs start from, resolved once (dprflow.plan.models): the initial model INIT
# (model.init, or MLM_MODEL, the MLM base trained here when model.init is mlm), the tokenizer
# INIT_TOKENIZER of the rules that only tokenize, the stage-one Condenser, each method's encoder.
MODELS = ModelPlan(config, RESULTS, REFERENCES, config["model"]["init"] == MLM_INIT)
MLM_MODEL, MLM_BASE = MODELS.mlm_model, MODELS.mlm_base
INIT, INIT_TOKENIZER = MODELS.init, MODELS.init_tokenizer


def stage_code(name):
    """The stage module's file and those of every dprflow module it imports (dprflow.stage_code):
    inputs of its rule, so editing the stage or any module it runs (a loss, the trainer) reruns it.
    """
    return stage_sources(name, SRC)


# The rows this run scores, from training collections and seeds to the comparison's rows:
# dprflow.plan.run_rows.
ROWS = RunRows(config, list(REFERENCES))
# Each collection's settings and splits, where a row is scored, ingest: dprflow.plan.collections.
COLLECTIONS = CollectionPlan(config, RESULTS, ROWS.training_collections())


# The baseline must be one of them: checked now, not when the comparison is made.
check_baseline(config, ROWS.comparison())


# ---- config sections and method families --------------------------------------------------------

FT = config["finetune"]


# an encoder whose corpus is encoded and searched: zeroshot, or seed-<seed>/<trained>
TRAINED_RETRIEVER = f"{SEED_PATTERN}/(r1|r2|distill)"
# a point of finetune.select's grids: retriever 1 trained on the fit part of the training queries
# (select/<point>, dprflow.finetuning.selection.point_name), retriever 2 (select/r2/<point>,
# the negatives' mix) or the distilled retriever (select/distill/<point>)
POINT = "[A-Za-z0-9_.=,-]+"
FIT_GRID = f"({NEGATIVES_GRID}|{DISTILL_GRID})/"
SELECT_RETRIEVER = f"{SEED_PATTERN}/select/({FIT_GRID})?{POINT}"
NATIVE_RETRIEVER = f"{plan_rows.ZEROSHOT}|{TRAINED_RETRIEVER}|{SELECT_RETRIEVER}"
# searched for the held-out training queries (the selection): a grid point, or the model off the
# shelf (its fusion weight)
HELDOUT_RETRIEVER = f"{plan_rows.ZEROSHOT}|{SELECT_RETRIEVER}"
# a reranker, in a seed's folder: the row's (rerank), or a point of finetune.select.reranker's
# grid, trained on the fit part (select/rerank/<point>)
RERANKER_POINT = f"select/{RERANKER_GRID}/{POINT}"
RERANKER = f"rerank|{RERANKER_POINT}"
# scored on the held-out training queries: BM25, a retriever above, or a reranker grid point
HELDOUT_ROW = (
    f"{plan_rows.BM25}|{NAME}/({HELDOUT_RETRIEVER}|{SEED_PATTERN}/{RERANKER_POINT})"
)
# searched for its evaluation queries only (no training run to mine): zeroshot, or a transfer
EVAL_ONLY_RETRIEVER = (
    f"{plan_rows.ZEROSHOT}|({NATIVE_RETRIEVER})/{plan_rows.transfer_folder(NAME)}"
)


wildcard_constraints:
    # ... with /on-<collection> when it encodes another collection's corpus (transfer)
    retriever=f"({NATIVE_RETRIEVER}){TRANSFER_SUFFIX}",
    trained=f"r1|r2|distill|select/({FIT_GRID})?{POINT}",
    seed="[0-9]+",
    shard="[0-9]+",


PT = config["pretrain"]


wildcard_constraints:
    mae="|".join(MAE_METHODS),
    mae_method="|".join(MAE_STAGE_METHODS),
    cocondenser="|".join(COCONDENSER_STAGE_METHODS),
    corpus="[A-Za-z0-9_-]+",


# What jobs ask a cluster for (memory, runtime) and how a training job starts: dprflow.plan.resources.
RESOURCES = ResourceEstimates(config)

# The pre-training rules' inputs and flags: dprflow.plan.pretrain.
PRETRAIN = PretrainPlan(config, SCHEMA, RESULTS, INIT_TOKENIZER)

# The selection's inputs and flags (finetune.select, finetune.fusion): dprflow.plan.selection.
SELECT = FT["select"]
# Each grid's points by folder name (an empty retriever grid is one point, the settings as
# configured; an empty reranker grid too where the distillation's grid needs a teacher trained on
# the fit part; an empty negatives or distillation grid has none).
GRIDS = {s: grid_points(SELECT[s], s) if SELECT[s] else [] for s in SELECT_SECTIONS}
GRIDS["retriever"] = GRIDS["retriever"] or [{}]
GRIDS["reranker"] = GRIDS["reranker"] or ([{}] if GRIDS["distill"] else [])
SELECTION = SelectionPlan(
    config, RESULTS, ROWS, {s: {point_name(p): p for p in GRIDS[s]} for s in GRIDS}
)

# The fine-tuning pipeline's inputs, flags and resources: dprflow.plan.finetune.
FINETUNE = FinetunePlan(config, SCHEMA, RESULTS, MODELS, SELECTION, RESOURCES, ROWS)

# The doc2query generator's inputs and flags (query-as-context): dprflow.plan.doc2query.
DOC2QUERY = Doc2QueryPlan(config, SCHEMA, RESULTS, COLLECTIONS)

# What the comparison and the report read, and the run's end checks: dprflow.plan.report.
REPORT = ReportPlan(config, RESULTS, ROWS, MODELS, REFERENCES)
