"""Where a training step's time goes: bench_train_throughput.py's rows, each followed by a
torch.profiler table of a second run of its timed steps (the operators with the most time on the
device, or on the CPU without a GPU) and the device's busy share: the kernels' summed time over
the run's wall time. A busy share well under 1 means the step waits on the host (Python, kernel
launches, host syncs), not on the GPU.

    python bench/profile_steps.py --device cuda --model base --batch-size 256 \\
        --tasks condenser bert --variants trainer --no-write

Takes bench_train_throughput.py's options; ``--rows N`` (first) sets the table's length (15).
``--mlm-loss fixed`` (first, after ``--rows``) is an experiment, not the stages' loss: the MLM loss
of the Condenser and the MAEs gathers a fixed number of positions (a fifth of the batch's, an
upper bound of the 15% masked ones) instead of a boolean index, whose size the host must wait
for; it shows what the step gains without that wait.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train_throughput as bench  # noqa: E402

ROWS = 15


def profiled_measure(label, setup, task, args, device, peak):
    row = bench_measure(label, setup, task, args, device, peak)
    run = setup(args.steps)
    bench.sync(device)
    gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        run()
        bench.sync(device)
        wall = time.perf_counter() - started
    events = prof.key_averages()
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    print(events.table(sort_by=key, row_limit=ROWS), flush=True)
    if gpu:  # the kernels' rows (an operator's row repeats its kernels' time)
        busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6
        print(f"  {label}: device busy {busy:.3f} s of {wall:.3f} s wall ({busy / wall:.0%})", flush=True)
    return row


bench_measure = bench.measure


def fixed_size_mlm_loss(lm_head, hidden, labels):
    """backbone.mlm_loss without a host sync: the top ``k`` of the selection mask (``k`` from
    the shape alone) gathered; the unmasked ones among them carry -100 and are ignored."""
    flat = labels.reshape(-1)
    selected = flat != -100
    k = max(1, flat.numel() // 5)
    index = torch.topk(selected.to(hidden.dtype), k, sorted=False).indices
    picked = hidden.reshape(-1, hidden.size(-1)).index_select(0, index)
    total = F.cross_entropy(lm_head(picked), flat.index_select(0, index), reduction="sum", ignore_index=-100)
    return total / selected.sum().clamp(min=1)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--rows"]:
        ROWS, argv = int(argv[1]), argv[2:]
    if argv[:2] == ["--mlm-loss", "fixed"]:
        from dprflow.pretraining.condenser import model as condenser_model
        from dprflow.pretraining.mae import model as mae_model

        condenser_model.mlm_loss = mae_model.mlm_loss = fixed_size_mlm_loss
        argv = argv[2:]
    bench.measure = profiled_measure
    sys.exit(bench.main(argv))
