"""The methods-study configs (config/examples/methods-*.yaml) plan every method with the
pre-training budgets docs/methods-study.md states.

A dry run (snakemake -n -p) of each config with its collection moved to a four-document BEIR
folder: no ../shared, nothing trained. The budgets table of the docs is read row by row and each
row's stage, found by its model folder, must be planned with that batch, learning rate, number of
passes (max_steps 0) and temperature.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from local_inputs import beir_folder, model_folder
from snakemake_cli import snakemake as run_snakemake

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
DOCS = ROOT / "docs" / "methods-study.md"
CONFIGS = ["methods-cranfield", "methods-cisi", "methods-scifact", "methods-scifact-mlm"]
HEADER = "| method | stage | model folder | batch | learning rate | passes | temperature |"
# The SciFact studies' tables: a step budget (max_steps) where a stage does not run whole passes.
SCIFACT_HEADER = "| method | stage | model folder | batch | learning rate | passes | steps | temperature |"
MLM_HEADER = "| method | stage (from the MLM base) | model folder | batch | learning rate | passes | steps | temperature |"
HEADERS = {"methods-scifact": SCIFACT_HEADER, "methods-scifact-mlm": MLM_HEADER}
# The fine-tuned row every method of a config reaches (the SciFact study stops at retriever 1,
# and runs retriever 2 for none, coCondenser and CoT-MAE).
LAST_ROW = {"methods-scifact": "r1", "methods-scifact-mlm": "r1"}
# The methods of every study, and the rows that also get retriever 2 (all of them: None).
METHODS = {
    "none",
    "condenser",
    "cocondenser",
    "contriever",
    "bmae",
    "cdmae",
    "cotmae",
    "qac-cocondenser",
    "qac-cotmae",
}
EXTRA_METHODS = {"methods-scifact-mlm": {"none-mean", "mlm"}}
R2 = {
    "methods-scifact": {"none", "cocondenser", "cotmae"},
    "methods-scifact-mlm": {"none", "cocondenser", "cotmae"},
}


def documented_budgets(header: str = HEADER) -> list[dict[str, str]]:
    """The rows of a budgets table in docs/methods-study.md (the one that opens with ``header``)."""
    lines = DOCS.read_text().splitlines()
    start = lines.index(header)
    keys = [k.strip() for k in header.strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        rows.append(dict(zip(keys, cells, strict=True)))
    return rows


def planned_commands(name: str, tmp_path: Path, config: dict | None = None) -> tuple[str, list[str]]:
    """The collection's name and the shell lines of the config's whole DAG (``config``: the
    example's, edited, in place of its file)."""
    if config is None:
        config = yaml.safe_load((ROOT / "config" / "examples" / f"{name}.yaml").read_text())
    # The trained collection; others (evaluate_only, for transfer) move to the same tiny folder.
    (collection,) = [c for c, spec in config["collections"].items() if not spec.get("evaluate_only")]
    folder = str(beir_folder(tmp_path / "beir"))
    for spec in config["collections"].values():
        spec["path"] = folder
    generic = config.get("pretrain", {}).get("generic_corpus", {})
    if generic.get("source") == "jsonl":  # the Debian corpus (make generic-corpus): a small stand-in
        # with a sequence a line at least for the MLM base's held-out sequences and a batch (a
        # one-line corpus is refused when the DAG is built)
        mlm = {"heldout_sequences": 256, "batch_size": 64, **config.get("model", {}).get("mlm", {})}
        line = '{"text": "A generic document of a few more words than a sequence needs."}\n'
        (tmp_path / "generic.jsonl").write_text(line * (mlm["heldout_sequences"] + mlm["batch_size"]))
        generic["path"] = str(tmp_path / "generic.jsonl")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    out = run_snakemake(
        [
            SNAKEMAKE,
            "-n",
            "-p",
            "-s",
            str(ROOT / "Snakefile"),
            "-d",
            str(tmp_path / "work"),
            "--configfile",
            str(tmp_path / "c.yaml"),
        ],
        cwd=ROOT,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    prefix = "Shell command: "
    return collection, [x[len(prefix) :] for x in out.stdout.splitlines() if x.startswith(prefix)]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """planned_commands of a config, planned once per module (two tests read the same plans)."""
    cache: dict[str, tuple[str, list[str]]] = {}

    def plan(name: str) -> tuple[str, list[str]]:
        if name not in cache:
            cache[name] = planned_commands(name, tmp_path_factory.mktemp(name))
        return cache[name]

    return plan


def flag(line: str, name: str) -> str:
    match = re.search(rf"--{name} (\S+)", line)
    assert match, f"--{name} missing from {line[:300]}"
    return match.group(1)


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_methods_config_plans_every_method_with_the_documented_budgets(name, plans):
    config = yaml.safe_load((ROOT / "config" / "examples" / f"{name}.yaml").read_text())
    assert set(config["methods"]) == METHODS | EXTRA_METHODS.get(name, set())
    collection, lines = plans(name)
    # Every method is fine-tuned through the same pipeline, up to the distilled retriever (the
    # SciFact study: retriever 1, and retriever 2 for the methods stages_of names).
    last = LAST_ROW.get(name, "distill")
    for method in config["methods"]:
        out = f"--out results/{collection}/{method}/seed-13/{last}/model"
        assert any(out in x for x in lines), f"{method}: no {last} planned"
    r2 = {m for m in config["methods"] if any(f"/{m}/seed-13/r2/model" in x for x in lines)}
    assert r2 == R2.get(name, set(config["methods"]))
    budgets = documented_budgets(HEADERS.get(name, HEADER))
    # pre-training stages (pretrain_tokenize writes token stores, it trains nothing)
    pretrain = [x for x in lines if re.match(r"python -m dprflow\.stages\.pretrain_(?!tokenize)", x)]
    folders = {row["model folder"].replace("<collection>", collection) for row in budgets}
    # The docs state every planned pre-training stage, and no other.
    assert {flag(x, "out") for x in pretrain} == folders
    for row in budgets:
        folder = row["model folder"].replace("<collection>", collection)
        (line,) = [x for x in pretrain if flag(x, "out") == folder]
        assert int(flag(line, "batch-size")) == int(row["batch"]), folder
        assert float(flag(line, "learning-rate")) == float(row["learning rate"]), folder
        assert int(flag(line, "epochs")) == int(row["passes"]), folder
        assert int(flag(line, "max-steps")) == int(row.get("steps", 0)), folder
        if row["temperature"] != "-":
            assert float(flag(line, "temperature")) == float(row["temperature"]), folder


def test_geometry_control_is_the_studys_none_r1_in_cls_dot(plans):
    """scifact-geometry-control.yaml (docs/methods-study.md) trains the study's none/r1 with the
    same command, but CLS pooling and the dot product, the geometry of the pre-trained rows."""

    def none_r1(name: str) -> str:
        _, lines = plans(name)
        (line,) = [x for x in lines if "--out results/scifact/none/seed-13/r1/model" in x]
        return line

    study, control = none_r1("methods-scifact"), none_r1("scifact-geometry-control")
    assert flag(control, "pooling") == "cls" and flag(control, "similarity") == "dot"
    drop = r" --(pooling|similarity) \S+"
    assert re.sub(drop, "", control) == re.sub(drop, "", study)


def test_the_mlm_study_scores_every_row_in_its_papers_geometry(plans):
    """methods-scifact-mlm.yaml starts every row from the MLM base, which has no pooling of its
    own: none and the [CLS] methods fine-tune in [CLS] and the dot product (no flag: the model's
    own), Contriever and none-mean, its control, in the mean and the dot product; every row is
    tested against both none rows."""
    _, lines = plans("methods-scifact-mlm")
    retrievers = {
        flag(x, "out").split("/")[2]: x
        for x in lines
        if "dprflow.stages.train_retriever" in x and "/r1/model" in flag(x, "out")
    }
    assert (
        flag(retrievers["none"], "init")
        == flag(retrievers["none-mean"], "init")
        == "results/pretrain/mlm/model"
    )
    for method, line in retrievers.items():
        geometry = re.findall(r"--(pooling|similarity) (\S+)", line)
        if method == "none-mean":
            assert geometry == [("pooling", "mean"), ("similarity", "dot")]
        elif method == "contriever":
            assert geometry == [("pooling", "mean")]  # its encoder's own similarity: dot
        else:
            assert geometry == [], method  # the MLM base's or the pre-trained encoder's own: cls, dot
    config = yaml.safe_load((ROOT / "config" / "examples" / "methods-scifact-mlm.yaml").read_text())
    assert config["evaluation"]["also_against"][:2] == ["none/r1", "none-mean/r1"]
    # every reference of a claim is a row the config trains (docs/methods-study.md)
    rows = {f"{m}/{s}" for m in config["methods"] for s in config["finetune"]["stages_of"].get(m, ["r1"])}
    assert set(config["evaluation"]["also_against"]) <= rows
    # the MLM base, and method mlm: the base continued on SciFact's documents, in its geometry
    base, control = sorted(
        (x for x in lines if "dprflow.stages.pretrain_mlm" in x), key=lambda x: flag(x, "out")
    )
    assert flag(base, "out") == "results/pretrain/mlm/model"
    assert flag(control, "out") == "results/scifact/mlm/pretrain/model"
    assert flag(control, "init") == "results/pretrain/mlm/model" and "--pooling" not in control


def test_the_mlm_study_seeds_its_claims_rows_and_chooses_one_recipe_with_none(plans):
    """methods-scifact-mlm.yaml (issue 54, docs/methods-study.md): the learning rate is chosen once,
    by none's three grid points on the fit part, and every row of every method and seed reads that
    choice; the rows of "the objective, not the text" and none/r1 fine-tune with seeds 13-15, every
    other row (retriever 2 included) with seed 13 alone."""
    _, lines = plans("methods-scifact-mlm")
    train = [x for x in lines if "dprflow.stages.train_retriever" in x]
    points = [x for x in train if "/select/" in flag(x, "out")]
    assert len(points) == 3 and all(
        flag(x, "out").startswith("results/scifact/none/seed-13/select/") for x in points
    )
    assert sorted(float(flag(x, "learning-rate")) for x in points) == [1e-4, 2e-4, 4e-4]
    seeds: dict[str, set[int]] = {}
    for line in train:
        if line in points:
            continue
        assert "--selection results/scifact/none/seed-13/select/selection.json" in line
        method, seed, stage = flag(line, "out").split("/")[2:5]
        seeds.setdefault(f"{method}/{stage}", set()).add(int(seed.removeprefix("seed-")))
    seeded = {f"{m}/r1" for m in ("none", "mlm", "cocondenser", "bmae", "cdmae", "cotmae")}
    assert {row for row, s in seeds.items() if s == {13, 14, 15}} == seeded
    assert all(s == {13} for row, s in seeds.items() if row not in seeded)
    assert len(seeds) == 11 + 3  # every method's r1, and r2 of none, cocondenser and cotmae


def test_the_probe_cuts_every_training_stage_of_the_mlm_study(tmp_path):
    """bench/bench_study_probes.py's cut of methods-scifact-mlm.yaml: every training stage at the
    probe's steps (method mlm's included), each method's retriever 1 once, no grid point, no seed
    but 13 and nothing fused."""
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_study_probes

    study = yaml.safe_load((ROOT / "config" / "examples" / "methods-scifact-mlm.yaml").read_text())
    init = str(model_folder(tmp_path / "base"))
    config, trained = bench_study_probes.probe_config(study, init, 7)
    assert trained == "scifact" and "seeds_of" not in config
    _, lines = planned_commands("probe", tmp_path, config)
    steps = [
        flag(x, "max-steps")
        for x in lines
        if re.match(r"python -m dprflow\.stages\.(pretrain_(?!tokenize)|train_)", x)
    ]
    assert steps and set(steps) == {"7"}, steps
    rows = [flag(x, "out") for x in lines if "dprflow.stages.train_retriever" in x]
    assert sorted(rows) == sorted(f"results/scifact/{m}/seed-13/r1/model" for m in study["methods"])
    assert not [x for x in lines if "dprflow.stages.fuse" in x]
    # the base is the probe's init, not trained again: method mlm's stage is the one MLM training
    (mlm,) = [x for x in lines if "dprflow.stages.pretrain_mlm" in x]
    assert flag(mlm, "init") == init and flag(mlm, "out") == "results/scifact/mlm/pretrain/model"
