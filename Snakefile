# dprflow: dense passage retrieval pre-training and fine-tuning, end to end.
# This file only sets things up; each stage family's rules live in rules/<family>.smk, the input
# functions, flags and resource estimates they call in src/dprflow/plan/ (two Snakemake-bound ones
# in rules/functions/), and each rule runs one module, python -m dprflow.stages.<rule>.

import sys

from snakemake.utils import min_version

min_version("8.20")

# The library (config checking here; the stage modules in every job) lives in src/.
sys.path.insert(0, f"{workflow.basedir}/src")
from dprflow.config import (
    check_baseline,
    read_config_file,
    reference_models,
    validate_config,
)
from dprflow.provenance import refuse_changed

# The default config, unless the command line names its own (--configfile replaces it whole, so a
# config file for another collection does not inherit the default collection).
if not workflow.overwrite_configfiles:
    # Malformed YAML named by line and column (a --configfile is read by Snakemake before this
    # file runs: `make run` and `python -m dprflow.config FILE` check it first).
    read_config_file(f"{workflow.basedir}/config/config.yaml")

    configfile: "config/config.yaml"


# `snakemake --report results/report.html` after a run: this text opens it.
report: "report/workflow.rst"


# Fill defaults and check every key before any rule reads the config.
SCHEMA = f"{workflow.basedir}/config/schema.yaml"
validate_config(config, SCHEMA)


include: "rules/common.smk"
include: "rules/collections.smk"
include: "rules/bm25.smk"
include: "rules/pretrain.smk"
include: "rules/doc2query.smk"
include: "rules/functions/retriever.smk"
include: "rules/functions/selection.smk"
include: "rules/retriever.smk"
include: "rules/reranker.smk"
include: "rules/selection.smk"
include: "rules/evaluation.smk"
include: "rules/report.smk"


# The exports no job reads (hub folders, faiss indexes) are checked against their provenance
# before planning: one changed or emptied by hand since its stage wrote it is refused by name, as
# every stage refuses such an input (dprflow.provenance.cached_sha256). Only where the workflow is
# planned: a cluster job parses this file again while other jobs may be rewriting those folders.
if workflow.is_main_process:
    refuse_changed(REPORT.hub_folders() + FINETUNE.faiss_index_dirs())


# Bookkeeping rules run where Snakemake runs, not as cluster jobs.
localrules:
    all,
    evaluate,
    evaluate_heldout,
    select_settings,
    select_fusion,
    fuse,
    trec_qrels,
    compare,
    export_model,
    nb_recall,
    mine_negatives,
    pmi,
    report_results,
    check,


rule all:
    default_target: True
    input:
        rules.compare.output,
        COLLECTIONS.trec_qrels_files(),
        REPORT.hub_folders(),
        REPORT.nb_recall_files(),
        FINETUNE.faiss_index_dirs(),
        rules.report_results.output,
