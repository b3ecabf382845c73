"""Benchmark: the retriever's training step with a batch's rows encoded in length groups, against
the whole batch padded to its longest (``BiEncoder.length_grouping``; docs/training.md).

The model has all-MiniLM-L6-v2's shape (6 layers, hidden 384, built from ``BertConfig``, so nothing
is downloaded); a step is the default run's: 32 queries and groups of 2 passages, the contrastive
loss with in-batch negatives, backward, AdamW. Passage lengths are drawn from the quantiles of the
default run's passages (``[CLS]`` + text + ``[SEP]`` cut at 144; mean 67 tokens), query lengths
uniform in 6..32. Both settings run the same batches, alternately, after one untimed step each;
the figure is the ratio of their times per step (grouped / whole) in one run::

    python bench/bench_length_groups.py                  # make bench
    python bench/bench_length_groups.py --steps 10 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _common import write_bench  # noqa: E402

from dprflow.finetuning.biencoder import BiEncoder  # noqa: E402
from dprflow.finetuning.losses import contrastive_loss  # noqa: E402

# Quantiles 0, 5, 10, 20, ..., 90, 95, 100 of the default run's passage lengths in tokens.
PASSAGE_QUANTILES = [5, 16, 19, 26, 33, 44, 55, 70, 91, 116, 135, 142, 144]
QUANTILE_POINTS = [0, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 100]


def batch(rng: np.random.Generator, rows: int, lengths: np.ndarray, vocab: int) -> dict[str, torch.Tensor]:
    width = int(lengths.max())
    mask = torch.from_numpy(np.arange(width)[None, :] < lengths[:, None]).long()
    ids = torch.from_numpy(rng.integers(1000, vocab, (rows, width))) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps of each setting")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    torch.manual_seed(0)
    model = BiEncoder(BertModel(config), pooling="mean", similarity="cosine").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    rng = np.random.default_rng(0)
    n_passages = args.batch_size * args.group_size
    steps = []
    for _ in range(args.steps + 1):
        p_len = (
            np.interp(rng.uniform(0, 100, n_passages), QUANTILE_POINTS, PASSAGE_QUANTILES).round().astype(int)
        )
        q_len = rng.integers(6, 33, args.batch_size)
        steps.append(
            (
                batch(rng, args.batch_size, q_len, config.vocab_size),
                batch(rng, n_passages, p_len, config.vocab_size),
            )
        )
    seconds = {True: 0.0, False: 0.0}
    for i, (q_in, p_in) in enumerate(steps):
        for grouped in (True, False):
            model.length_grouping = grouped
            start = time.perf_counter()
            q, p = model(q_in, p_in)
            contrastive_loss(q, p, group_size=args.group_size, temperature=model.temperature).backward()
            optimizer.step()
            optimizer.zero_grad()
            if i:  # the first step of each is warm-up
                seconds[grouped] += time.perf_counter() - start
    padded = sum(s[1]["attention_mask"].numel() for s in steps[1:])
    real = sum(int(s[1]["attention_mask"].sum()) for s in steps[1:])
    ratio = seconds[True] / seconds[False]
    print(
        f"{args.steps} steps of {args.batch_size} queries x {args.group_size} passages, {args.threads} threads: "
        f"grouped {seconds[True] / args.steps:.2f} s a step, whole {seconds[False] / args.steps:.2f} s "
        f"(passage tokens: {real} real of {padded} padded)"
    )
    write_bench(
        "length_groups_step_ratio",
        ratio,
        "grouped / whole seconds per step",
        n=args.steps,
        seconds=seconds[True] + seconds[False],
        grouped_s_per_step=seconds[True] / args.steps,
        whole_s_per_step=seconds[False] / args.steps,
        threads=args.threads,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
