"""Shared helpers of the benchmark scripts: every benchmark writes one small JSON file per figure.

A figure is ``{"name", "value", "unit", ...extra, "machine"}`` in ``results/bench/<name>.json`` (or
under ``$DPRFLOW_BENCH_DIR``), so results of different benchmarks and machines can be collected
with one glob. Scripts in ``bench/`` import this as ``from _common import write_bench``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def bench_dir() -> Path:
    return Path(os.environ.get("DPRFLOW_BENCH_DIR") or ROOT / "results" / "bench")


def machine() -> dict[str, Any]:
    """What the figure depends on: CPU cores, and torch's intra-op threads when torch is installed."""
    info: dict[str, Any] = {"cores": os.cpu_count()}
    try:
        import torch
    except ImportError:
        info["torch_threads"] = None
    else:
        info["torch_threads"] = torch.get_num_threads()
    return info


def write_bench(name: str, value: float, unit: str, **extra: Any) -> Path:
    """Write ``results/bench/<name>.json`` with ``name``, ``value``, ``unit``, the extra keys and ``machine``.

    ``extra`` should hold at least ``n`` (items measured) and ``seconds`` (time taken); a
    ``machine`` key overrides the detected one. The file is replaced atomically. Returns its path.
    """
    if not name or "/" in name:
        raise ValueError(f"bench name must be a plain file stem, got {name!r}")
    record = {"name": name, "value": value, "unit": unit, **extra}
    record.setdefault("machine", machine())
    out = bench_dir() / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    shown = f"{value:.6g}" if isinstance(value, int | float) else repr(value)
    print(f"{name}: {shown} {unit} -> {out}")
    return out


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (``VmRSS``, ``VmHWM``: the peak resident set)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (``VmHWM``) of this process; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False
