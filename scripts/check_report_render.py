"""Open the results report in a headless browser and confirm it renders: the comparison table has a
row per system of compare.csv, each figure decodes to a non-empty image, and Snakemake's
self-contained report.html builds its page (its script runs and lists the figures and the table).

Usage (after `make run` and `make report`; `make render-check` does both and installs Debian's
chromium when it is missing):

    python scripts/check_report_render.py --results results --report results/report.html

Prints OK or FAIL per check and exits 1 on any FAIL. Screenshots go to <results>/render_check/ so
a person can look at what the browser drew.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.image import imread

FIGURES = ("training_loss.png", "nb_recall.png", "main_metric.png")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit(
        "no headless browser found (tried: " + ", ".join(BROWSERS) + "); install one, e.g. "
        "`apt-get install chromium`, or run `make render-check`, which does"
    )


def headless(url: str, *args: str, timeout: int = 120) -> str:
    """Run the browser headless on ``url``; returns its standard output."""
    cmd = [
        browser(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=10000",
        *args,
        url,
    ]
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [*cmd, f"--user-data-dir={profile}"], capture_output=True, text=True, timeout=timeout
        )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def dom(path: Path) -> str:
    return headless(path.resolve().as_uri(), "--dump-dom")


def screenshot(path: Path, out: Path, size: str = "1400,1000") -> float:
    """Screenshot of the page; returns the pixel standard deviation (0 for a blank page)."""
    headless(path.resolve().as_uri(), f"--screenshot={out.resolve()}", f"--window-size={size}")
    image = imread(out)
    return float(np.std(image[..., :3]))


def image_sizes(figures: list[Path], work: Path) -> dict[str, str]:
    """The size the browser decoded each figure to (``WxH``; ``0x0`` when it could not)."""
    page = work / "figures.html"
    imgs = "".join(f"<img src='{html.escape(f.resolve().as_uri())}'>" for f in figures)
    script = (
        "<script>window.addEventListener('load',()=>{const o=document.createElement('pre');"
        "o.id='sizes';o.textContent=[...document.images].map(i=>i.naturalWidth+'x'+i.naturalHeight)"
        ".join(' ');document.body.appendChild(o);});</script>"
    )
    page.write_text(f"<!DOCTYPE html><html><body>{imgs}{script}</body></html>")
    found = re.search(r"<pre id=\"sizes\">([^<]*)</pre>", dom(page))
    sizes = found.group(1).split() if found else []
    return {f.name: (sizes[i] if i < len(sizes) else "0x0") for i, f in enumerate(figures)}


def check(results: Path, report: Path | None) -> list[tuple[str, bool, str]]:
    pieces = results / "report"
    out = results / "render_check"
    out.mkdir(parents=True, exist_ok=True)
    checks: list[tuple[str, bool, str]] = []

    page = pieces / "comparison.html"
    rendered = dom(page)
    systems = pd.read_csv(results / "compare.csv")["system"].drop_duplicates()
    cells = set(re.findall(r"<tr><td>([^<]+)</td>", rendered))
    missing = [s for s in systems if s not in cells]
    checks.append(
        (
            "comparison table",
            not missing,
            f"{len(systems) - len(missing)}/{len(systems)} rows"
            + (f", missing {missing}" if missing else ""),
        )
    )
    spread = screenshot(page, out / "comparison.png")
    checks.append(("comparison screenshot", spread > 1e-3, f"pixel std {spread:.3f}"))

    figures = [pieces / name for name in FIGURES]
    for name, size in image_sizes(figures, out).items():
        w, h = (int(v) for v in size.split("x"))
        checks.append((f"figure {name} decoded", w > 100 and h > 100, size))
    for figure in figures:
        wrapper = out / f"{figure.stem}.html"
        wrapper.write_text(
            f"<!DOCTYPE html><html><body style='margin:0'><img src='{html.escape(figure.resolve().as_uri())}'></body></html>"
        )
        spread = screenshot(wrapper, out / f"{figure.stem}_screenshot.png")
        checks.append((f"figure {figure.name} drawn", spread > 1e-2, f"pixel std {spread:.3f}"))

    if report is not None:
        rendered = dom(report)
        wanted = [*FIGURES, "comparison.html", "config.yaml"]
        absent = [w for w in wanted if w not in rendered]
        checks.append(
            (
                "snakemake report lists its items",
                not absent,
                "all of " + ", ".join(wanted) if not absent else f"missing {absent}",
            )
        )
        spread = screenshot(report, out / "report.png")
        checks.append(("snakemake report screenshot", spread > 1e-3, f"pixel std {spread:.3f}"))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", default="results", help="the results folder (with report/ and compare.csv)"
    )
    parser.add_argument("--report", default=None, help="Snakemake's report.html (snakemake --report ...)")
    args = parser.parse_args(argv)
    results = Path(args.results)
    for need in [
        results / "compare.csv",
        results / "report" / "comparison.html",
        *(results / "report" / f for f in FIGURES),
    ]:
        if not need.is_file():
            raise SystemExit(f"{need}: missing; run `make run` first")
    report = Path(args.report) if args.report else None
    if report is not None and not report.is_file():
        raise SystemExit(f"{report}: missing; run `make report` first")
    results_of_checks = check(results, report)
    for name, ok, detail in results_of_checks:
        print(f"{'OK  ' if ok else 'FAIL'} {name}: {detail}")
    print(f"screenshots: {results / 'render_check'}")
    return 0 if all(ok for _, ok, _ in results_of_checks) else 1


if __name__ == "__main__":
    sys.exit(main())
