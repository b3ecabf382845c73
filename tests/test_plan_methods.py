"""dprflow.plan.methods: one record per method, and the schema, the docs and the planned jobs
agree with it (issue 53: adding a method is one record)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from dry_runs import all_methods_plan, commands_by_rule

from dprflow.plan import methods

ROOT = Path(__file__).resolve().parents[1]


def test_the_records_are_the_schemas_methods():
    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    assert [m.name for m in methods.METHODS] == schema["properties"]["methods"]["items"]["enum"]
    assert all(m.reproduces for m in methods.METHODS)


def test_every_pre_trained_model_card_cites_its_methods_paper():
    from dprflow.models.st_format import METHOD_PAPERS

    pretrained = [m.name for m in methods.METHODS if m.family]
    assert all(methods.BY_NAME[name].citation for name in pretrained)
    assert not any(m.citation for m in methods.METHODS if not m.family)  # nothing pre-trained to cite
    assert list(METHOD_PAPERS) == ["mlm-base", *pretrained]  # and the MLM base's card cites BERT


def test_every_method_is_on_the_methods_page():
    page = (ROOT / "docs" / "methods.md").read_text()
    table = page.split("| method | what the loss is fed (pre-training) | paper |")[1].split("\n\n")[0]
    listed = re.findall(r"^\| `([a-z-]+)` \|", table, flags=re.M)
    assert [m.name for m in methods.METHODS if not m.geometry] == listed


def test_the_derived_lists():
    assert methods.ZEROSHOT_METHODS == ["contriever"]
    assert methods.PRETRAINED_POOLING == {"contriever": "mean"}
    assert methods.GEOMETRY_CONTROLS == {"none-mean": ("mean", "dot")}
    assert methods.QAC_METHODS == {"qac-cocondenser": "cocondenser", "qac-cotmae": "cotmae"}
    assert methods.MAE_STAGE_METHODS == ["bmae", "cdmae", "cotmae", "qac-cotmae"]
    assert [m.name for m in methods.METHODS if m.encoder == "generic"] == ["condenser"]
    assert [m.name for m in methods.METHODS if m.encoder is None] == ["none", "none-mean"]
    assert [m.name for m in methods.METHODS if m.init_geometry] == ["mlm"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    every = [m.name for m in methods.METHODS]
    plan = all_methods_plan(tmp_path_factory.mktemp("plan"), yaml.safe_dump({"methods": every}))
    return "\n".join(line for lines in commands_by_rule(plan).values() for line in lines)


@pytest.mark.parametrize("method", methods.METHODS, ids=lambda m: m.name)
def test_the_planned_jobs_follow_the_record(planned, method):
    """A corpus stage iff the record says so; a zeroshot row of its own iff it says so; its
    rows start from its corpus stage's model, the stage-one model or the initial model."""
    corpus_model = f"results/stdlib/{method.name}/pretrain/model"
    assert (f"--out {corpus_model}" in planned) == method.corpus_stage
    zeroshot = f"results/stdlib/{method.name}/zeroshot/run.parquet" in planned
    # none/zeroshot is every run's model off the shelf, not a row of method none's own
    assert zeroshot == (method.zeroshot_row or method.name == "none")
    (r1,) = [
        line
        for line in planned.splitlines()
        if f"--out results/stdlib/{method.name}/seed-13/r1/model" in line
    ]
    starts = {"corpus": corpus_model, "generic": "results/pretrain/condenser/generic/model"}
    if method.encoder:
        assert f"--model {starts[method.encoder]}" in r1 or f"--init {starts[method.encoder]}" in r1
    else:
        assert "/pretrain/" not in r1.split("--out")[0]
