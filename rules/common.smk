# Helpers for the DAG: paths, config look-ups and target lists. No rule lives here.
#
# The flags of a rule's params are functions of the wildcards only, never of `input`: Snakemake
# leaves params that take `input` out of its params-changed rerun trigger (snakemake issue 3895),
# so a changed setting would not rerun the job. They rebuild the input paths they name instead.

import json
import os
import shlex
from pathlib import Path

# The stage modules run as `python -m dprflow.stages.<rule>`; the shell prefix makes the package
# importable in every job (local, conda or cluster) without requiring it to be installed.
SRC = f"{workflow.basedir}/src"
PYTHONPATH = os.pathsep.join(p for p in (SRC, os.getenv("PYTHONPATH")) if p)
shell.prefix(f"export PYTHONPATH={shlex.quote(PYTHONPATH)}; ")

RESULTS = "results"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
# The fine-tuned stages, each run once per seed.
STAGES = ["r1", "r2", "rerank", "distill"]
# Methods whose pre-trained encoder is a retriever as it is (Contriever's unsupervised setting):
# they get a zeroshot row of their own beside none/zeroshot.
ZEROSHOT_METHODS = ["contriever"]
# The bi-encoder pooling each method was pre-trained with; the others use finetune.pooling.
METHOD_POOLING = {"contriever": "mean"}


wildcard_constraints:
    collection="(?!pretrain$)[A-Za-z0-9_-]+",
    method="[A-Za-z0-9_-]+",
    # bm25, <method>/zeroshot, or <method>/seed-<seed>/<stage> (a fine-tuned row of one seed)
    system=f"bm25|[A-Za-z0-9_-]+/(zeroshot|seed-[0-9]+/({'|'.join(STAGES)}))",


def compare_results_dir(wildcards, output):
    """The results folder the compared metrics files are relative to (where compare.md goes)."""
    return os.path.dirname(output.md)


def report_results_dir(wildcards, output):
    """The results folder (the report pages live in its report/ subfolder)."""
    return os.path.dirname(os.path.dirname(output.html))


def stage_code(name):
    """The stage module's file: an input of its rule, so editing the stage reruns it."""
    return os.path.join(SRC, "dprflow", "stages", f"{name}.py")


def collection_spec(wildcards):
    return config["collections"][wildcards.collection]


def collection_dir(wildcards):
    return f"{RESULTS}/{wildcards.collection}"


def ingest_out_dir(wildcards):
    return f"{RESULTS}/{wildcards.collection}/collection"


def ingest_inputs(wildcards):
    """BEIR files are inputs (a changed file reruns ingest); other sources have none."""
    spec = collection_spec(wildcards)
    if spec["source"] != "beir":
        return []
    root = spec["path"]
    files = [os.path.join(root, "corpus.jsonl"), os.path.join(root, "queries.jsonl")]
    files += [
        os.path.join(root, "qrels", f"{s}.tsv")
        for s in ("train", "dev", "test")
        if os.path.exists(os.path.join(root, "qrels", f"{s}.tsv"))
    ]
    return files


def ingest_flags(wildcards):
    spec = collection_spec(wildcards)
    flags = [f"--source {spec['source']}"]
    if spec["source"] == "embedded" and spec.get("max_documents") is not None:
        flags.append(f"--max-documents {spec['max_documents']}")
    if spec["source"] == "embedded":
        share = spec["split_percent"]
        flags.append(f"--split-percent {share['train']} {share['dev']} {share['test']}")
    if spec["source"] == "beir":
        flags.append(f"--path {shlex.quote(spec['path'])}")
    if spec["source"] == "ir_datasets":
        flags.append(f"--ir-datasets {shlex.quote(json.dumps(spec['ir_datasets']))}")
    return " ".join(flags)


def eval_split(wildcards):
    return collection_spec(wildcards)["eval_split"]


def train_split(wildcards):
    return collection_spec(wildcards)["train_split"]


def paper_references():
    """collection=reference pairs for the comparison's table beside the papers."""
    pairs = [
        f"{c}={spec['reference']}"
        for c, spec in config["collections"].items()
        if spec["reference"]
    ]
    return " ".join(shlex.quote(p) for p in pairs)


def finetune_seeds():
    """The fine-tuning seeds: the top-level seeds list, else finetune.seed alone."""
    return config["seeds"] or [config["finetune"]["seed"]]


def systems():
    """Every evaluated row of the comparison: BM25, the initial model off the shelf, and each
    method's fine-tuning stages once per seed (<method>/seed-<seed>/<stage>)."""
    rows = ["bm25", "none/zeroshot"]
    rows += [f"{m}/zeroshot" for m in config["methods"] if m in ZEROSHOT_METHODS]
    for method in config["methods"]:
        for seed in finetune_seeds():
            rows += [f"{method}/seed-{seed}/{stage}" for stage in STAGES]
    return rows


def nb_recall_files():
    return [
        f"{RESULTS}/{c}/{m}/seed-{s}/nb_recall.parquet"
        for c in config["collections"]
        for m in config["methods"]
        for s in finetune_seeds()
    ]


def metrics_files():
    return [
        f"{RESULTS}/{c}/{s}/metrics.parquet"
        for c in config["collections"]
        for s in systems()
    ]


# ---- the fine-tuning pipeline ---------------------------------------------------------------

FT = config["finetune"]


wildcard_constraints:
    # an encoder whose corpus is encoded and searched: zeroshot, or seed-<seed>/<trained>
    retriever="zeroshot|seed-[0-9]+/(r1|r2|distill)",
    trained="r1|r2|distill",
    seed="[0-9]+",
    shard="[0-9]+",


PT = config["pretrain"]


MAE_METHODS = ["bmae", "cdmae", "cotmae"]
# Query-as-context (doc2query queries as the context of their passage) and the method whose
# stage-one model and pre-training stage it shares.
QAC_METHODS = {"qac-cocondenser": "cocondenser", "qac-cotmae": "cotmae"}
# Methods pre-trained on each collection (their encoder: <collection>/<method>/pretrain/model).
CORPUS_PRETRAINED = ["cocondenser", "contriever", *MAE_METHODS, *QAC_METHODS]


wildcard_constraints:
    mae="|".join(MAE_METHODS),
    mae_method="|".join(MAE_METHODS + ["qac-cotmae"]),
    cocondenser="cocondenser|qac-cocondenser",
    corpus="[A-Za-z0-9_-]+",


def pretrained_encoder(wildcards):
    """The pre-trained encoder folder of a method (an input of its retrievers); none for method none."""
    if wildcards.method == "condenser":
        return [f"{RESULTS}/pretrain/condenser/generic/model"]
    if wildcards.method in CORPUS_PRETRAINED:
        return [f"{RESULTS}/{wildcards.collection}/{wildcards.method}/pretrain/model"]
    return []


def method_init(wildcards):
    """The checkpoint a method's fine-tuning starts from (method none: model.init itself)."""
    encoder = pretrained_encoder(wildcards)
    return encoder[0] if encoder else config["model"]["init"]


def generic_corpus_input(wildcards):
    path = PT["generic_corpus"]["path"]
    return [path] if path else []


def train_flags(section, keys):
    """`--key value` flags of a config section (booleans as true/false, null keys left out)."""
    flags = []
    for key in keys:
        value = section[key]
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        flags.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(flags)


def pretrain_generic_flags(wildcards):
    corpus = PT["generic_corpus"]
    flags = f"--corpus {corpus['source']} --seed {FT['seed']} --checkpoint-every {FT['checkpoint_every']}"
    if corpus["path"]:
        flags += f" --corpus-path {shlex.quote(corpus['path'])}"
    keys = [
        "n_early",
        "n_head_layers",
        "mlm_probability",
        "whole_word",
        "max_length",
        "batch_size",
        "learning_rate",
        "weight_decay",
        "warmup_ratio",
        "epochs",
        "max_steps",
    ]
    return f"{flags} {train_flags(PT['condenser'], keys)}"


def pretrain_corpus_flags(wildcards):
    queries = "".join(f" --queries {shlex.quote(p)}" for p in qac_queries_input(wildcards))
    keys = [
        "span_min",
        "span_max",
        "batch_size",
        "chunk_size",
        "contrastive_only",
        "mlm_probability",
        "learning_rate",
        "weight_decay",
        "warmup_ratio",
        "epochs",
        "max_steps",
    ]
    return (
        f"--seed {FT['seed']} --checkpoint-every {FT['checkpoint_every']}"
        f" {train_flags(PT['cocondenser'], keys)}{queries}"
    )


def shards():
    return list(range(FT["encode_shards"]))


def method_pooling(method):
    return METHOD_POOLING.get(method, FT["pooling"])


def encoder_inputs(wildcards):
    """The trained model folder of a retriever; for a zeroshot row, the method's pre-trained
    encoder (none for the initial model off the shelf)."""
    if wildcards.retriever == "zeroshot":
        return pretrained_encoder(wildcards)
    return f"{RESULTS}/{wildcards.collection}/{wildcards.method}/{wildcards.retriever}/model"


def run_tag(wildcards):
    """The TREC run tag of a dense run: method, seed and stage, e.g. none-seed-13-r2."""
    return "-".join([wildcards.method, *Path(wildcards.retriever).parts])


def encoder_flags(wildcards):
    if wildcards.retriever == "zeroshot":
        if wildcards.method == "none":
            return f"--model {config['model']['init']} --pooling {config['model']['zeroshot_pooling']}"
        return f"--model {method_init(wildcards)} --pooling {method_pooling(wildcards.method)}"
    return f"--model {RESULTS}/{wildcards.collection}/{wildcards.method}/{wildcards.retriever}/model"


def embedding_shards(wildcards):
    base = f"{RESULTS}/{wildcards.collection}/{wildcards.method}/{wildcards.retriever}"
    return [f"{base}/embeddings/shard_{s}.parquet" for s in shards()]


def train_depth():
    """Training-query runs feed mining (K2) and the reranker (K3)."""
    return max(FT["mining_depth"], FT["reranker"]["depth"])


def retriever_inputs(wildcards):
    """The pre-trained encoder, negative pools (and teacher scores) of each trained retriever."""
    base = f"{RESULTS}/{wildcards.collection}"
    method = f"{base}/{wildcards.method}/seed-{wildcards.seed}"
    out = {}
    if pretrained_encoder(wildcards):
        out["encoder"] = pretrained_encoder(wildcards)[0]
    if wildcards.trained == "r1":
        out["negatives"] = f"{base}/bm25/negatives.parquet"
    elif wildcards.trained == "r2":
        out["negatives"] = f"{method}/r1/negatives.parquet"
        if FT["r2_bm25_fraction"] > 0:
            out["extra"] = f"{base}/bm25/negatives.parquet"
    else:
        out["negatives"] = f"{method}/r2/negatives.parquet"
        out["teacher"] = f"{method}/rerank/teacher_scores.parquet"
    return out


def retriever_flags(wildcards):
    """Hyper-parameters of one trained retriever (distillation has its own section)."""
    inputs = retriever_inputs(wildcards)
    common = (
        f"--pooling {method_pooling(wildcards.method)} --shared {str(FT['shared_encoder']).lower()}"
        f" --seed {wildcards.seed}"
        f" --max-query-length {FT['max_query_length']} --max-passage-length {FT['max_passage_length']}"
        f" --checkpoint-every {FT['checkpoint_every']}"
    )
    if wildcards.trained == "distill":
        d = FT["distill"]
        flags = (
            f" --teacher {inputs['teacher']} --alpha {d['alpha']} --direction {d['direction']}"
            f" --temperature {d['temperature']}"
        )
    else:
        d = FT["retriever"]
        flags = f" --temperature {d['temperature']}"
        if "extra" in inputs:
            flags += f" --extra-negatives {inputs['extra']} --extra-fraction {FT['r2_bm25_fraction']}"
    return f"{common}{flags}{optim_flags(d)}"


def optim_flags(section):
    return (
        f" --batch-size {section['batch_size']} --group-size {section['group_size']}"
        f" --learning-rate {section['learning_rate']} --weight-decay {section['weight_decay']}"
        f" --warmup-ratio {section['warmup_ratio']} --epochs {section['epochs']}"
        f" --max-steps {section['max_steps']}"
    )


def mining_depth(wildcards):
    return FT["mining_depth"] if wildcards.trained == "r1" else FT["reranker"]["depth"]


def reranker_init():
    return FT["reranker"]["init"] or config["model"]["init"]


def reranker_pooling():
    """The cross-encoder head's pooling: as configured, else the pooling model.init was trained
    with when the reranker starts from it (mean for all-MiniLM-L6-v2), else BERT's [CLS] pooler.
    """
    r = FT["reranker"]
    if r["pooling"]:
        return r["pooling"]
    return config["model"]["zeroshot_pooling"] if not r["init"] else "cls"


def reranker_flags(wildcards):
    r = FT["reranker"]
    return (
        f"--pooling {reranker_pooling()}"
        + optim_flags(r)
        + f" --max-length {r['max_length']} --head-learning-rate {r['head_learning_rate']}"
        + f" --seed {wildcards.seed} --checkpoint-every {FT['checkpoint_every']}"
    )


def pmi_corpus_input(wildcards):
    """The texts whose n-grams are counted: a collection's passages, or the generic corpus file."""
    if wildcards.corpus == "pretrain":
        return generic_corpus_input(wildcards)
    return [f"{RESULTS}/{wildcards.corpus}/passages.parquet"]


def pmi_count_flags(wildcards):
    p = PT["pmi"]
    if wildcards.corpus == "pretrain":
        source = PT["generic_corpus"]["source"]
    else:
        source = "passages"
    flags = f"--corpus {source} --shards {p['shards']} --max-n {p['max_n']} --max-distinct {p['max_distinct']}"
    for path in pmi_corpus_input(wildcards):
        flags += f" --corpus-path {shlex.quote(path)}"
    return flags


def pmi_count_mem_mb(wildcards):
    """Counting holds up to max_distinct entries of 16 bytes, twice while combining, plus a batch."""
    return 1000 + 32 * PT["pmi"]["max_distinct"] // 2**20


def pmi_shard_files(wildcards):
    return [
        f"{RESULTS}/{wildcards.corpus}/pmi/counts/{s}.parquet"
        for s in range(PT["pmi"]["shards"])
    ]


def _mae_pmi(wildcards, corpus):
    """CDMAE's n-gram statistics of the corpus pre-trained on; the other MAEs need none."""
    if mae_variant(wildcards) != "cdmae":
        return []
    return [f"{RESULTS}/{corpus}/pmi/ngram_counts.parquet"]


def mae_generic_pmi(wildcards):
    return _mae_pmi(wildcards, "pretrain")


def mae_corpus_pmi(wildcards):
    return _mae_pmi(wildcards, wildcards.collection)


def mae_variant(wildcards):
    """The MAE a pre-training job trains: its generic ({mae}) or corpus ({mae_method}) wildcard;
    qac-cotmae is CoT-MAE with query contexts."""
    if "mae" in wildcards.keys():
        return wildcards.mae
    return QAC_METHODS.get(wildcards.mae_method, wildcards.mae_method)


def mae_generic_model(wildcards):
    return f"{RESULTS}/pretrain/{mae_variant(wildcards)}/generic/model"


def qac_queries_input(wildcards):
    """A query-as-context method's doc2query queries; none for the other methods."""
    method = wildcards.get("cocondenser") or wildcards.get("mae_method")
    if method not in QAC_METHODS:
        return []
    return [f"{RESULTS}/{wildcards.collection}/doc2query/generated_queries.parquet"]


def mae_generic_flags(wildcards):
    return mae_flags(wildcards, "generic")


def mae_corpus_flags(wildcards):
    return mae_flags(wildcards, "corpus")


def mae_flags(wildcards, phase):
    """Flags of a pretrain_mae job: shared MAE settings, the method's decoder mask ratio, the
    phase's budget and (generic phase) the corpus."""
    m = PT["mae"]
    flags = [
        f"--seed {FT['seed']} --checkpoint-every {FT['checkpoint_every']}",
        f"--p-dec {m['p_dec'][mae_variant(wildcards)]}",
        train_flags(
            m,
            [
                "p_enc",
                "sigma",
                "n_decoder_layers",
                "use_projection",
                "max_length",
                "span_min",
                "span_max",
                "context",
                "batch_size",
                "learning_rate",
                "weight_decay",
                "warmup_ratio",
            ],
        ),
        train_flags(m[phase], ["epochs", "max_steps"]),
    ]
    pmi = mae_generic_pmi(wildcards) if phase == "generic" else mae_corpus_pmi(wildcards)
    for path in pmi:
        flags.append(f"--pmi {shlex.quote(path)}")
    for path in qac_queries_input(wildcards) if phase == "corpus" else []:
        flags.append(f"--queries {shlex.quote(path)}")
    if phase == "generic":
        corpus = PT["generic_corpus"]
        flags.append(f"--corpus {corpus['source']}")
        if corpus["path"]:
            flags.append(f"--corpus-path {shlex.quote(corpus['path'])}")
    return " ".join(flags)


def training_launcher(wildcards, resources):
    """How a training job starts its stage: ``python`` for one process, or ``torchrun`` with one
    process per GPU when the job holds several (``resources: gpu``, set in a profile). The stage
    code is the same; DDP and the cross-device gathering of negatives start from torchrun's
    environment (dprflow.distributed)."""
    gpus = int(resources.get("gpu", 0) or 0)
    if gpus <= 1:
        return "python"
    return f"torchrun --standalone --nproc-per-node {gpus}"


def pretrained_models(collection, method):
    """Every pre-training model folder of a method (stage one and two), for the loss curves."""
    if method == "condenser":
        return [f"{RESULTS}/pretrain/condenser/generic/model"]
    if method in ("cocondenser", "qac-cocondenser"):
        return [
            f"{RESULTS}/pretrain/condenser/generic/model",
            f"{RESULTS}/{collection}/{method}/pretrain/model",
        ]
    if method == "qac-cotmae":
        return [
            f"{RESULTS}/pretrain/cotmae/generic/model",
            f"{RESULTS}/{collection}/{method}/pretrain/model",
        ]
    if method == "contriever":
        return [f"{RESULTS}/{collection}/contriever/pretrain/model"]
    if method in MAE_METHODS:
        return [
            f"{RESULTS}/pretrain/{method}/generic/model",
            f"{RESULTS}/{collection}/{method}/pretrain/model",
        ]
    return []


def training_model_dirs():
    """The model folder of every training stage of the run; each holds its train_log.csv."""
    dirs = []
    for c in config["collections"]:
        for m in config["methods"]:
            dirs += pretrained_models(c, m)
            dirs += [
                f"{RESULTS}/{c}/{m}/seed-{seed}/{s}/model"
                for seed in finetune_seeds()
                for s in STAGES
            ]
    return list(dict.fromkeys(dirs))


def config_json():
    return shlex.quote(json.dumps(config, sort_keys=True))


def expected_metrics_file(wildcards):
    path = config["evaluation"]["expected"]
    if not path:
        raise ValueError(
            "evaluation.expected is not set: name a file of expected metrics to check against"
        )
    return path


def pretrain_contriever_flags(wildcards):
    keys = [
        "negatives",
        "pairs",
        "queue_size",
        "momentum",
        "temperature",
        "ratio_min",
        "ratio_max",
        "max_doc_tokens",
        "p_delete",
        "p_replace",
        "p_mask",
        "batch_size",
        "learning_rate",
        "weight_decay",
        "warmup_ratio",
        "epochs",
        "max_steps",
    ]
    return f"--seed {FT['seed']} --checkpoint-every {FT['checkpoint_every']} {train_flags(PT['contriever'], keys)}"


# ---- doc2query ------------------------------------------------------------------------------


def doc2query_model_input(wildcards):
    """The trained generator folder, unless config names a ready seq2seq model."""
    if PT["doc2query"]["model"]:
        return []
    return [f"{RESULTS}/{wildcards.collection}/doc2query/model"]


def doc2query_model(wildcards):
    return (
        PT["doc2query"]["model"] or f"{RESULTS}/{wildcards.collection}/doc2query/model"
    )


def train_doc2query_flags(wildcards):
    d = PT["doc2query"]
    keys = [
        "max_passage_length",
        "max_query_length",
        "validation_fraction",
        "batch_size",
        "learning_rate",
        "weight_decay",
        "warmup_ratio",
        "epochs",
        "max_steps",
    ]
    flags = f"--seed {FT['seed']} --checkpoint-every {FT['checkpoint_every']} {train_flags(d['train'], keys)}"
    return flags + f" --eval-splits {' '.join(eval_splits_of(wildcards))}"


def eval_splits_of(wildcards):
    """Query splits the generator must never train on: every split but the training one."""
    spec = collection_spec(wildcards)
    return sorted({spec["eval_split"], "dev", "test"} - {spec["train_split"]})


def doc2query_flags(wildcards):
    d = PT["doc2query"]
    keys = [
        "n_queries",
        "top_p",
        "top_k",
        "max_new_tokens",
        "batch_size",
        "max_passages",
    ]
    flags = f"--seed {FT['seed']} {train_flags(d, keys)}"
    if d["input_prefix"]:
        flags += f" --input-prefix {shlex.quote(d['input_prefix'])}"
    return flags


# ---- cluster requests from config sizes --------------------------------------------------------
# Memory (MB) and runtime (minutes) of the jobs whose needs grow with the corpus or the batch, so
# that a paper-scale config asks a cluster for enough and the default run for little. The rates
# are deliberately slow estimates (a busy GPU node); override any rule in a profile's
# set-resources.
EMBED_BYTES = 768 * 4  # one float32 vector of a BERT-base encoder
ENCODE_PER_S = 500  # passages encoded per second
TRAIN_SEQ_MB = 20  # host memory per sequence of a training step
STEP_S = 2.0  # seconds per training step


def passages_estimate(collection):
    spec = config["collections"][collection]
    size = spec.get("size", {}).get("passages")
    if size:
        return size
    if spec.get("max_documents"):
        return 3 * spec["max_documents"]
    return 1_000_000


def train_queries_estimate(collection):
    spec = config["collections"][collection]
    return spec.get("size", {}).get("train_queries") or max(
        1, passages_estimate(collection) // 10
    )


def encode_mem_mb(wildcards):
    per_shard = passages_estimate(wildcards.collection) // FT["encode_shards"] + 1
    return int(3000 + 3 * per_shard * EMBED_BYTES / 2**20)


def encode_runtime(wildcards):
    per_shard = passages_estimate(wildcards.collection) // FT["encode_shards"] + 1
    return int(15 + per_shard / ENCODE_PER_S / 60)


def search_mem_mb(wildcards):
    """The whole flat index is held at once (queries are searched in batches)."""
    return int(
        3000 + 1.5 * passages_estimate(wildcards.collection) * EMBED_BYTES / 2**20
    )


def search_runtime(wildcards):
    return int(15 + passages_estimate(wildcards.collection) / 200_000)


def bm25_mem_mb(wildcards):
    return int(4000 + passages_estimate(wildcards.collection) / 1000)


def bm25_runtime(wildcards):
    return int(15 + passages_estimate(wildcards.collection) / 60_000)


def _train_steps(section, collection):
    if section["max_steps"]:
        return section["max_steps"]
    per_epoch = train_queries_estimate(collection) // section["batch_size"] + 1
    return section["epochs"] * per_epoch


def _train_resources(section, collection):
    sequences = section["batch_size"] * section.get("group_size", 1)
    mem = int(4000 + TRAIN_SEQ_MB * sequences)
    runtime = int(
        30 + _train_steps(section, collection) * STEP_S * max(1, sequences / 64) / 60
    )
    return mem, runtime


def retriever_section(wildcards):
    return FT["distill"] if wildcards.trained == "distill" else FT["retriever"]


def train_retriever_mem_mb(wildcards):
    return _train_resources(retriever_section(wildcards), wildcards.collection)[0]


def train_retriever_runtime(wildcards):
    return _train_resources(retriever_section(wildcards), wildcards.collection)[1]


def train_reranker_mem_mb(wildcards):
    return _train_resources(FT["reranker"], wildcards.collection)[0]


def train_reranker_runtime(wildcards):
    return _train_resources(FT["reranker"], wildcards.collection)[1]


def rerank_runtime(wildcards):
    """K3 pairs per query; the evaluation queries are at most a tenth of the training ones here."""
    pairs = FT["reranker"]["depth"] * max(
        1000, train_queries_estimate(wildcards.collection) // 10
    )
    return int(15 + pairs / ENCODE_PER_S / 60)
