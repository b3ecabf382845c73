"""The package's layering, read from the source: stage modules on top, the library below them,
pre-training and fine-tuning side by side over dprflow.models, and model modules that hold a
model and its loss without knowing how they are stepped."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dprflow"
# Model modules: a model and its loss as the paper writes it (no trainer, gradient cache or
# distributed helpers: the training machinery calls them).
MODEL_MODULES = [
    "pretraining/backbone.py",
    "pretraining/condenser/model.py",
    "pretraining/contriever/model.py",
    "pretraining/mae/model.py",
    "pretraining/mlm/model.py",
    "finetuning/biencoder.py",
    "finetuning/cross_encoder.py",
    "finetuning/losses.py",
]


def imported_modules(path: Path) -> set[str]:
    """Every dprflow module a file imports, at any depth of the file (deferred imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n.split(".")[0] == "dprflow"}


def library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "stages" not in p.relative_to(PACKAGE).parts)


def test_the_library_never_imports_a_stage():
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(m for m in imported_modules(p) if m.startswith("dprflow.stages"))
        for p in library_files()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_stage_imports_another_stage():
    """A stage is a command over the library; what two stages share lives in the library (issue
    53: search_dense took encode_corpus's flags, bm25_negatives bm25_search's settings)."""
    offenders = {
        p.stem: sorted(
            m
            for m in imported_modules(p)
            if m.startswith("dprflow.stages.") and m.split(".")[2] not in (p.stem, "__init__")
        )
        for p in sorted((PACKAGE / "stages").glob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("module", MODEL_MODULES)
def test_model_modules_do_not_know_how_they_are_trained(module):
    path = PACKAGE / module
    assert path.is_file(), module
    assert sorted(m for m in imported_modules(path) if m.startswith("dprflow.training")) == []


# What a part of the library never imports (issue 42): pre-training does not stand on
# fine-tuning; both stand on dprflow.models (the model folder format, loading the initial model,
# pooling, the text a passage is encoded as), which stands on neither; the config (read when the
# DAG is built) loads no fine-tuning module.
NEVER_IMPORTS = {
    "pretraining": ("dprflow.finetuning",),
    "models": ("dprflow.pretraining", "dprflow.finetuning", "dprflow.training"),
    "config.py": ("dprflow.finetuning",),
    # the rows' grammar and the methods' records: what the rules, the comparison and the report
    # share, standing on nothing
    "plan/rows.py": ("dprflow.",),
    "plan/methods.py": ("dprflow.",),
    # the rest of the plan (the rules' inputs and flags) is read when the DAG is built: no model,
    # training, search or evaluation code
    "plan": (
        "dprflow.models",
        "dprflow.training",
        "dprflow.finetuning",
        "dprflow.pretraining",
        "dprflow.stages",
        "dprflow.search",
        "dprflow.evaluation",
        "dprflow.data",
    ),
}


@pytest.mark.parametrize("part", NEVER_IMPORTS)
def test_lower_parts_do_not_import_higher_ones(part):
    root = PACKAGE / part
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    assert files and all(p.is_file() for p in files), part
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(
            m for m in imported_modules(p) if m.startswith(NEVER_IMPORTS[part])
        )
        for p in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_every_folder_says_what_it_holds():
    for folder in sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder} has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} has no docstring"


def test_every_rule_has_its_stage_module():
    rules = Path(__file__).resolve().parents[1] / "rules"
    named = set()
    for smk in rules.glob("*.smk"):
        for line in smk.read_text().splitlines():
            if "stage_code(" in line and "def stage_code" not in line:
                named.add(line.split('stage_code("')[1].split('"')[0])
    assert named, "no rule names a stage module"
    missing = sorted(n for n in named if not (PACKAGE / "stages" / f"{n}.py").is_file())
    assert missing == []


ROOT = PACKAGE.parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_opens_with_the_two_commands():
    """What it does, make run and make test within the first 60 lines, the default run's table,
    where to go next; the rest lives in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    head = "\n".join(lines[:60])
    assert "make run" in head and "make test" in head
    assert "| none/r2 |" in head  # the default run's table
    assert len(lines) <= 100, len(lines)
    assert "(docs/README.md)" in "\n".join(lines)


def test_every_docs_page_opens_with_what_it_is_for_and_is_in_the_index():
    index = (DOCS / "README.md").read_text()
    pages = sorted(DOCS.glob("*.md"))
    assert len(pages) > 5
    for page in pages:
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[1] == "", page.name
        assert lines[2] and not lines[2].startswith(("#", "|", "```", "-")), page.name  # a sentence first
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"{page.name} is not listed in docs/README.md"


def test_links_between_the_pages_resolve():
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


TESTS = Path(__file__).resolve().parent


def test_no_test_file_imports_another():
    """What test files share lives in conftest.py (fixtures) and helper modules (plain functions,
    not named test_*.py), never in another test file (issue 42): a fixture imported from a test
    file is registered again in the importing one (a module-scoped one built again there) behind a
    `# noqa: F401/F811`, and the importing file then breaks when the other is split or renamed."""
    test_modules = {p.stem for p in TESTS.glob("test_*.py")}
    offenders = {}
    for path in sorted(TESTS.glob("test_*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        imported = sorted(n for n in names if set(n.split(".")) & test_modules)
        if imported:
            offenders[path.name] = imported
    assert len(test_modules) > 50
    assert offenders == {}


def make_target(name: str) -> str:
    """The recipe lines of one target of the Makefile, joined."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(name)}:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.M)
    assert match, f"no target {name} in the Makefile"
    return match.group(1)


def test_ci_runs_every_test_make_test_leaves_out():
    """`make test` leaves out the tests marked slow; CI runs it and then `make test-slow`, whose
    marker expression is the complement, so every test still runs on every CI run."""
    fast, slow = make_target("test"), make_target("test-slow")
    assert "-m 'not slow'" in fast and re.search(r"-m slow\b", slow), (fast, slow)
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ci.index("make test") < ci.index("make test-slow"), ci
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^\s+"slow: ', pyproject, re.M), "the slow marker is not declared"
