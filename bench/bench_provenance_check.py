"""What checking an output against its provenance costs (issue 41): a stage refuses an input
whose bytes differ from those its producer recorded, and the workflow refuses a changed export
before planning (dprflow.provenance).

The check reads content only when the sizes, names and modification times of an artifact's files
differ from both its record's and its hash cache's; otherwise it costs one ``stat`` per file. This
benchmark times both paths on a folder of ``--mb`` MiB in ``--files`` files (a model folder's
shape) and a single file, and projects the hashing path to MS MARCO's artifacts from the measured
rate: passages.parquet 3.1 GB, a BERT-base model 0.44 GB, one model's embeddings 27 GB.

    python bench/bench_provenance_check.py --mb 1024 --work /tmp/provbench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write_bench

sys.path.insert(0, str(ROOT / "src"))
from dprflow import provenance  # noqa: E402

MS_MARCO_GB = {"passages.parquet": 3.1, "BERT-base model": 0.44, "one model's embeddings": 27.0}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def make_folder(folder: Path, mb: int, files: int) -> None:
    folder.mkdir(parents=True)
    block = os.urandom(1 << 20)
    for i in range(files):
        with open(folder / f"part-{i}.bin", "wb") as fh:
            for _ in range(max(1, mb // files)):
                fh.write(block)
    entry = provenance.artifact_entry(folder)
    provenance.record_path(folder).write_text(json.dumps({"stage": "bench", "artifact": entry}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="MiB in the folder")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="provbench-"))
    folder = work / "model"
    shutil.rmtree(folder, ignore_errors=True)
    provenance.hash_cache_path(folder).unlink(missing_ok=True)
    make_folder(folder, args.mb, args.files)
    untouched = min(timed(lambda: provenance.changed_since_written(folder)) for _ in range(5))
    for part in folder.iterdir():  # Snakemake-like touch: same bytes, new mtimes
        os.utime(part)
    rehash = timed(lambda: provenance.changed_since_written(folder))  # reads every byte once
    cached = min(timed(lambda: provenance.changed_since_written(folder)) for _ in range(5))
    rate = args.mb / rehash
    print(f"{args.mb} MiB in {args.files} files: stat only {untouched * 1e3:.2f} ms, hashed after a touch "
          f"{rehash:.2f} s ({rate:.0f} MiB/s), then from the hash cache {cached * 1e3:.2f} ms")  # fmt: skip
    for name, gb in MS_MARCO_GB.items():
        print(f"  MS MARCO {name} ({gb} GB): hashed once in about {gb * 1024 / rate:.0f} s")
    write_bench("provenance_check_stat_ms", round(untouched * 1e3, 3), "ms", mb=args.mb, files=args.files)
    write_bench("provenance_check_hash_mib_s", round(rate, 1), "MiB/s", mb=args.mb, files=args.files)
    if args.work is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
