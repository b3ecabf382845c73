"""Where a training step's time goes: bench_train_throughput.py's rows, each followed by a
torch.profiler table of a second run of its timed steps (the operators with the most time on the
device, or on the CPU without a GPU) and the device's busy share: the kernels' summed time over
the run's wall time. A busy share well under 1 means the step waits on the host (Python, kernel
launches, host syncs), not on the GPU.

    python bench/profile_steps.py --device cuda --model base --batch-size 256 \\
        --tasks condenser bert --variants trainer --no-write

Takes bench_train_throughput.py's options; ``--rows N`` (first) sets the table's length (15).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

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

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--rows"]:
        ROWS, argv = int(argv[1]), argv[2:]
    bench.measure = profiled_measure
    sys.exit(bench.main(argv))
