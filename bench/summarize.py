"""Print the latest benchmark figures (results/bench/*.json) as a Markdown table, and write it to
bench/RESULTS.md (the snapshot the README links to)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from _common import bench_dir, machine


def fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, int | float) else ("" if v is None else str(v))


def load_text(record: dict) -> str:
    load = record.get("load_average") or {}
    return ", ".join(f"{'/'.join(map(str, v))} {k.replace('_', ' ')}" for k, v in load.items()) or "?"


def startup_table(records: list[dict]) -> str:
    """bench_startup.py's figures, one row per stage (they would crowd the main table)."""
    numpy = next((r for r in records if r["name"] == "startup_numpy"), None)
    stages = [r for r in records if r["name"] != "startup_numpy"]
    if not stages:
        return ""
    rows = [
        "\n## Start-up per stage (bench/bench_startup.py)\n",
        "`python -m dprflow.stages.<stage> --help` in a fresh process, best of "
        f'{stages[0].get("n", "?")} (median beside it); `python -c "import numpy"` in the same run: '
        f"{fmt(numpy['value']) if numpy else '?'} s; load average (1, 5, 15 min) {load_text(stages[0])}. "
        "`before`: the checkout given to --compare-src.\n",
        "| stage | s | median | before | median before | imports torch | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in stages:
        rows.append(
            f"| {r['name'].removeprefix('startup_')} | {fmt(r['value'])} | {fmt(r.get('median'))} | "
            f"{fmt(r.get('before'))} | {fmt(r.get('before_median'))} | "
            f"{'yes' if r.get('imports_torch') else 'no'} | {fmt(r.get('target'))} |"
        )
    return "\n".join(rows)


def fmt_big(v) -> str:
    """Whole numbers with thousands separators from 1,000 up, else as :func:`fmt`."""
    return f"{v:,.0f}" if isinstance(v, int | float) and abs(v) >= 1000 else fmt(v)


def scale_table(payload: dict) -> str:
    """bench_scale.py's results/bench/scale.json: per stage the sizes measured, the exponents
    between the two largest, the MS MARCO projection and what the Slurm profile gives the job."""
    records = payload["records"]
    sizes = sorted({r["passages"] for r in records})
    head = " | ".join(f"{n:,} s | {n:,} MB" for n in sizes)
    documents = ", ".join(
        f"{r['documents']:,}"
        for r in sorted(
            {r["passages"]: r for r in records if r["documents"]}.values(), key=lambda r: r["passages"]
        )
    )
    rows = [
        "\n## Scale: every stage from 10k passages up, projected to MS MARCO (bench/bench_scale.py)\n",
        f"Seconds and peak RSS (Snakemake's benchmark files) per stage at {', '.join(f'{n:,}' for n in sizes)} "
        "passages"
        + (
            f" (`doc:` stages and coCondenser's spans: the document variant, {documents} documents)"
            if documents
            else ""
        )
        + ", exponents between the two largest sizes, the projection to MS MARCO "
        "(8.8M passages, 502k training queries, 3.2M documents) and the profile's memory and runtime "
        f"for the job. Load average during the runs: {'/'.join(f'{v:.1f}' for v in payload.get('load_average', []))}. "
        "Targets: time exponent <= 1.15; peak RSS at the largest size <= 4 GB except bm25_index "
        "and search_dense; the projection within the profile (`local`: a localrule, run where "
        "Snakemake runs, which no profile governs). Memory is projected by the line through the two "
        "largest sizes, or by their power law where it grows above linear or, with three sizes or "
        "more, where its growth slowed by half or more (a bounded buffer): `memory_model` in "
        "scale.json.\n",
        f"| stage | {head} | time exp. | mem exp. | MS MARCO s | MS MARCO MB | profile MB | profile min | on target |",
        "|---|" + "---|" * (2 * len(sizes)) + "---|---|---|---|---|---|---|",
    ]
    by = {(r["stage"], r["passages"]): r for r in records}
    for st in payload["stages"]:
        cells = []
        for n in sizes:
            r = by.get((st["stage"], n))
            cells += [fmt(r["seconds"]) if r else "", fmt(r["max_rss_mb"]) if r else ""]
        # fits_profile "local": a localrule, run where Snakemake runs; no profile governs it
        ok = st["meets_time_exponent"] and st["meets_rss"] and st["fits_profile"]
        why = [k for k in ("meets_time_exponent", "meets_rss", "fits_profile") if not st[k]]
        verdict = ("yes" if ok else "no: " + ", ".join(why)) + (
            " (local)" if st["fits_profile"] == "local" else ""
        )
        rows.append(
            f"| {st['stage']} | {' | '.join(cells)} | {fmt(st['time_exponent'])} | {fmt(st['memory_exponent'])} | "
            f"{fmt_big(st['msmarco_seconds'])} | {fmt_big(st['msmarco_max_rss_mb'])} | {fmt_big(st['profile_mem_mb'])} | "
            f"{fmt_big(st['profile_runtime_min'])} | {verdict} |"
        )
    dry = payload.get("dry_runs") or {}
    if dry:
        rows.append(
            "\n`snakemake -n` on each preset (the DAG at paper scale): "
            + "; ".join(f"{name} {d['jobs']} jobs in {d['seconds']:.1f} s" for name, d in sorted(dry.items()))
            + "."
        )
    return "\n".join(rows)


def pmi_table(payload: dict) -> str:
    """bench_scale.py --pmi's results/bench/pmi_scale.json: pmi_count and pmi run alone."""
    rows = [
        "\n## PMI counting and merging at three sizes (bench/bench_scale.py --pmi)\n",
        "| stage | passages | shards | max_distinct | min_count | distinct n-grams | s | peak MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["records"]:
        rows.append(
            f"| {r['stage']} | {fmt_big(r['passages'])} | {r['shards']} | {fmt_big(r.get('max_distinct'))} | "
            f"{fmt(r.get('min_count'))} | {fmt_big(r['distinct'])} | {fmt(r['seconds'])} | {fmt_big(r['max_rss_mb'])} |"
        )
    return "\n".join(rows)


def main() -> None:
    rows = [
        "| benchmark | value | unit | baseline | ratio | target | device |",
        "|---|---|---|---|---|---|---|",
    ]
    startup = []
    scale = pmi = None
    for path in sorted(bench_dir().glob("*.json")):
        r = json.loads(path.read_text())
        if path.name == "scale.json":
            scale = r
            continue
        if path.name == "pmi_scale.json":
            pmi = r
            continue
        if r["name"].startswith("startup_"):
            startup.append(r)
            continue
        rows.append(
            f"| {r['name']} | {fmt(r['value'])} | {r['unit']} | {fmt(r.get('baseline'))} | "
            f"{fmt(r.get('ratio'))} | {fmt(r.get('target'))} | {r.get('device') or 'this machine'} |"
        )
    table = "\n".join(rows) + ("\n" + startup_table(startup) if startup else "")
    table += "\n" + scale_table(scale) if scale else ""
    table += "\n" + pmi_table(pmi) if pmi else ""
    print(table)
    header = (
        "# Latest benchmark figures\n\n"
        f"Written by `make bench` (bench/summarize.py) on a machine with {machine()['cores']} cores "
        f"(torch threads {machine()['torch_threads']}); the JSON files behind it are in results/bench/.\n\n"
    )
    if os.environ.get("DPRFLOW_BENCH_SNAPSHOT", "1") == "1":
        (Path(__file__).parent / "RESULTS.md").write_text(header + table + "\n")


if __name__ == "__main__":
    main()
