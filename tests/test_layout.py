"""The package's layering, read from the source: stage modules on top, the library below them,
and model modules that hold a model and its loss without knowing how they are stepped."""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize("module", MODEL_MODULES)
def test_model_modules_do_not_know_how_they_are_trained(module):
    path = PACKAGE / module
    assert path.is_file(), module
    assert sorted(m for m in imported_modules(path) if m.startswith("dprflow.training")) == []


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
