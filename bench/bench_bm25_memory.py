"""Peak memory of the BM25 stages, split into anonymous memory and file-backed pages, per process.

Snakemake's benchmark files (``max_rss``: psutil's RSS summed over the job's processes) count the
pages of memory-mapped files (Lucene reads its index through memory maps; the JVM maps its
libraries and the Anserini jar) together with anonymous memory (the JVM's heap and its own memory,
Python's tables). Only the anonymous part must fit in RAM: mapped pages of a clean file are dropped
when memory is short. This script runs bm25_index, bm25_search and bm25_negatives as stage
modules on the files of a ``bench_scale.py`` run folder (passages, queries, qrels and the index it
built), samples ``/proc/<pid>/status`` (``RssAnon``, ``RssFile`` + ``RssShmem``) of every process
of the job every 0.1 s, and writes per stage the peak of the sums and each process's peaks
(``results/bench/bm25_memory.json``).

    python bench/bench_scale.py --passages 40000,160000 --documents '' --stages 'bm25_.*'
    python bench/bench_bm25_memory.py --run results/bench/scale-work/run-160000-0 --stages bm25_index,bm25_search
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write_bench

COLLECTION = "scale"  # bench_scale.py's collection name
STAGES = ("bm25_index", "bm25_search", "bm25_negatives")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc/<pid>/task/*/children``."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except OSError:  # exited meanwhile
            continue
    return found


def _status(pid: int) -> dict | None:
    """Name and resident KiB (anonymous, file-backed + shared) of one process, None once gone."""
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key == "Name":
                    fields["name"] = value.strip()
                elif key in ("RssAnon", "RssFile", "RssShmem"):
                    fields[key] = int(value.split()[0])
    except OSError:
        return None
    if "RssAnon" not in fields:  # a zombie
        return None
    return {"name": fields["name"], "anon": fields["RssAnon"], "file": fields["RssFile"] + fields["RssShmem"]}


def sampled_run(argv: list[str], cwd: Path, interval: float = 0.1) -> dict:
    """Run ``python argv`` and sample its process tree: seconds, the peaks (MB) of the summed
    anonymous, file-backed and total RSS, and per process (``name:pid``) its own peaks."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.perf_counter()
    output = tempfile.TemporaryFile()  # the stage's log, shown if it fails
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT
    )
    peak = {"anon": 0, "file": 0, "rss": 0}
    per_process: dict[str, dict[str, int]] = {}
    while proc.poll() is None:
        total = {"anon": 0, "file": 0}
        for pid in _tree(proc.pid):
            status = _status(pid)
            if status is None:
                continue
            mine = per_process.setdefault(f"{status['name']}:{pid}", {"anon": 0, "file": 0})
            for key in total:
                total[key] += status[key]
                mine[key] = max(mine[key], status[key])
        peak = {
            "anon": max(peak["anon"], total["anon"]),
            "file": max(peak["file"], total["file"]),
            "rss": max(peak["rss"], total["anon"] + total["file"]),
        }
        time.sleep(interval)
    with output:
        output.seek(0)
        tail = output.read().decode(errors="replace")[-3000:]
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} exited with status {proc.returncode} in {cwd}:\n{tail}")
    mb = 1024  # KiB in a MB
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_anon_mb": round(peak["anon"] / mb),
        "peak_file_mb": round(peak["file"] / mb),
        "peak_rss_mb": round(peak["rss"] / mb),
        # java -version (finding the runtime) is a short-lived process of its own: left out.
        "processes": {
            name: {f"{k}_mb": round(v / mb) for k, v in peaks.items()}
            for name, peaks in per_process.items()
            if peaks["anon"] + peaks["file"] > 64 * mb
        },
    }


def stage_argv(stage: str, run: Path, out: Path, heap_mb: int) -> list[str]:
    """The stage module's command line on the files of a bench_scale.py run (its config's BM25)."""
    r = run / "results" / COLLECTION
    common = ["--heap-mb", str(heap_mb), "--threads", "1"]
    if stage == "bm25_index":
        return ["-m", "dprflow.stages.bm25_index", "--passages", str(r / "passages.parquet"),
                "--index", str(out / "index"), *common]  # fmt: skip
    search = ["--index", str(r / "bm25" / "index"), "--queries", str(r / "collection" / "queries.parquet"),
              "--k1", "0.82", "--b", "0.68", *common]  # fmt: skip
    if stage == "bm25_search":
        return ["-m", "dprflow.stages.bm25_search", *search, "--split", "test", "--k", "1000",
                "--out", str(out / "run.parquet")]  # fmt: skip
    return ["-m", "dprflow.stages.bm25_negatives", *search, "--split", "train", "--depth", "1000",
            "--qrels", str(r / "collection" / "qrels.parquet"), "--passages", str(r / "passages.parquet"),
            "--out", str(out / "negatives.parquet")]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run", required=True, action="append", help="a bench_scale.py run folder (repeatable)"
    )
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--heap-mb", type=int, default=4096, help="the stages' --heap-mb (the JVM's -Xmx)")
    args = parser.parse_args()
    stages = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    records = []
    for run in map(Path, args.run):
        passages = int(run.name.split("-")[1])  # run-<passages>-<documents>
        for stage in stages:
            with tempfile.TemporaryDirectory(prefix="bm25-memory-") as tmp:
                rec = sampled_run(stage_argv(stage, run, Path(tmp), args.heap_mb), run)
            records.append({"stage": stage, "passages": passages, "heap_mb": args.heap_mb, **rec})
            print(records[-1], flush=True)
    write_bench(
        "bm25_memory",
        max(r["peak_anon_mb"] for r in records),
        "MB anonymous memory, the largest peak (records: per stage and size)",
        n=len(records),
        seconds=sum(r["seconds"] for r in records),
        records=records,
    )


if __name__ == "__main__":
    main()
