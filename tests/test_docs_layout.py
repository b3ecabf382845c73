"""docs/layout.md names every module of the package, and every module it names exists.

The page's table names modules in the form it has always used, which this test reads: a row whose
path is a folder of the package (`src/dprflow/`, `src/dprflow/training/`, ...) names that folder's
modules in its second cell as backticked bare names, each with a few words on what it holds:
`trainer` is src/dprflow/training/trainer.py, and a trailing slash names a package, so
`collections/` in the row of `src/dprflow/data/` is src/dprflow/data/collections/. A package is
named either so or by a row of its own. Other backticked text in those cells (a file such as
`paper_numbers.csv`, a command, a dotted config key) is not read; a backticked bare name that is
not a module (a setting's value, a rule's name) is read as one and fails the second test.

Both sides are compared as package paths: `dprflow/training/trainer.py` for a module (every
``.py`` but ``__init__.py``), `dprflow/data/collections/` for a package. A module added, removed or
renamed without the page following fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "layout.md"
SRC = ROOT / "src"

FOLDER_CELL = re.compile(r"`src/(dprflow/(?:[a-z_][a-z0-9_]*/)*)`")
BARE_NAME = re.compile(r"`([a-z_][a-z0-9_]*/?)`")


def modules_on_disk() -> set[str]:
    """Every module (``dprflow/x/y.py``) and package (``dprflow/x/``) under src/dprflow/."""
    package = SRC / "dprflow"
    found = {
        str(p.relative_to(SRC))
        for p in package.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    found.update(f"{p.parent.relative_to(SRC)}/" for p in package.rglob("__init__.py") if p.parent != package)
    return found


def modules_on_page(text: str) -> set[str]:
    """The modules and packages the page's folder rows name, as the docstring above describes."""
    named = set()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2:
            continue
        folder = FOLDER_CELL.fullmatch(cells[0])
        if folder is None:
            continue
        prefix = folder.group(1)
        if prefix != "dprflow/":
            named.add(prefix)
        for name in BARE_NAME.findall("|".join(cells[1:])):
            named.add(prefix + name if name.endswith("/") else f"{prefix}{name}.py")
    return named


def test_the_page_reads_as_the_docstring_says():
    sample = (
        "| `src/dprflow/data/` | `schemas` (every table), `collections/` (loaders), `x.csv` |\n"
        "| `src/dprflow/stages/<rule>.py` | `ingest` |\n"
        "| `rules/bm25.smk` | `bm25_index` |\n"
    )
    assert modules_on_page(sample) == {
        "dprflow/data/",
        "dprflow/data/schemas.py",
        "dprflow/data/collections/",
    }


def test_every_module_is_named_on_the_page():
    missing = sorted(modules_on_disk() - modules_on_page(PAGE.read_text()))
    assert missing == [], (
        f"docs/layout.md does not name {len(missing)} module(s); add each as `name` (what it holds) "
        f"to the row of its folder: {missing}"
    )


def test_every_module_the_page_names_exists():
    stale = sorted(modules_on_page(PAGE.read_text()) - modules_on_disk())
    assert stale == [], (
        f"docs/layout.md names {len(stale)} module(s) that src/dprflow/ does not hold "
        f"(renamed or removed? or a backticked bare word in a src/dprflow row): {stale}"
    )
