"""Provenance records: written by every stage beside its outputs, with the arguments, input hashes,
code version, packages and machine; a changed input changes the record."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from dprflow import provenance
from dprflow.data.schemas import write_table
from dprflow.stages import pmi, pmi_count


def passages_table(path, text="wing lift flow"):
    rows = [("d0#0", "d0", 0, "", text, 3), ("d1#0", "d1", 0, "", "heat shock wave", 3)]
    df = pd.DataFrame(rows, columns=["passage_id", "doc_id", "position", "title", "text", "n_tokens"])
    write_table(df, path, "passages")
    return path


def test_a_stage_writes_its_record_beside_the_output(tmp_path):
    passages = passages_table(tmp_path / "passages.parquet")
    out = tmp_path / "counts.parquet"
    assert pmi_count.main(["--corpus", "passages", "--corpus-path", str(passages), "--out", str(out)]) == 0
    record = json.loads((tmp_path / "counts.parquet.provenance.json").read_text())
    assert record["stage"] == "pmi_count" and record["args"]["max_n"] == 4
    assert record["inputs"] == {str(passages): hashlib.sha256(passages.read_bytes()).hexdigest()}
    assert len(record["code"]["commit"]) == 40 and isinstance(record["code"]["dirty"], bool)
    assert record["packages"]["pandas"] == pd.__version__
    assert record["machine"]["cpus"] >= 1 and record["wall_seconds"] >= 0
    assert provenance.read(out) == record
    # Another input gives another record; the same input the same hashes.
    passages_table(passages, "wing lift drag")
    assert pmi_count.main(["--corpus", "passages", "--corpus-path", str(passages), "--out", str(out)]) == 0
    assert provenance.read(out)["inputs"][str(passages)] != record["inputs"][str(passages)]


def test_a_failed_stage_writes_no_record(tmp_path):
    out = tmp_path / "counts.parquet"
    missing = tmp_path / "missing.parquet"
    assert pmi_count.main(["--corpus", "passages", "--corpus-path", str(missing), "--out", str(out)]) == 1
    assert not out.exists() and not provenance.record_path(out).exists()


def test_folder_hash_covers_names_and_contents_but_not_records(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "a.txt").write_text("one")
    (folder / "sub").mkdir()
    (folder / "sub" / "b.txt").write_text("two")
    first = provenance.sha256_of(folder)
    (folder / "provenance.json").write_text("{}")
    assert provenance.sha256_of(folder) == first
    (folder / "sub" / "b.txt").write_text("three")
    assert provenance.sha256_of(folder) != first
    (folder / "sub" / "b.txt").write_text("two")
    (folder / "a.txt").rename(folder / "c.txt")
    assert provenance.sha256_of(folder) != first
    assert provenance.record_path(folder) == folder / "provenance.json"
    assert provenance.record_path(folder / "c.txt") == folder / "c.txt.provenance.json"


def test_output_arguments_are_named_by_convention():
    assert all(map(provenance.is_output_arg, ["out", "trec", "out_md", "train_out"]))
    assert not any(map(provenance.is_output_arg, ["outer", "init", "checkpoint_dir", "passages"]))


def test_a_stage_reuses_the_hash_recorded_beside_its_input_and_refuses_a_changed_one(tmp_path, monkeypatch):
    passages = passages_table(tmp_path / "passages.parquet")
    counts = tmp_path / "counts.parquet"
    assert pmi_count.main(["--corpus", "passages", "--corpus-path", str(passages), "--out", str(counts)]) == 0
    truth = hashlib.sha256(counts.read_bytes()).hexdigest()
    assert provenance.read(counts)["artifact"]["sha256"] == truth
    assert provenance.read(counts)["artifact"]["size"] == counts.stat().st_size

    hashed = []
    real = provenance.sha256_of
    monkeypatch.setattr(provenance, "sha256_of", lambda path: hashed.append(str(path)) or real(path))
    merged = tmp_path / "merged.parquet"
    assert pmi.main(["--counts", str(counts), "--out", str(merged)]) == 0
    # The counts table was written by pmi_count: its hash comes from its record, not its content.
    assert provenance.read(merged)["inputs"] == {str(counts): truth}
    assert hashed == [str(merged)]  # only pmi's own output, hashed once for its record
    assert provenance.cached_sha256(counts) == (truth, True)

    # Touched or rewritten: the recorded size/mtime no longer match, so it is hashed again.
    hashed.clear()
    os.utime(counts, ns=(0, 0))  # same content, other mtime: hashed again, same value
    assert provenance.cached_sha256(counts) == (truth, False) and hashed == [str(counts)]
    counts.write_bytes(counts.read_bytes() + b"x")  # other content: refused, with its stage named
    with pytest.raises(
        provenance.ChangedArtifactError, match=r"counts.parquet: changed since the 'pmi_count'"
    ):
        provenance.cached_sha256(counts)
    assert pmi.main(["--counts", str(counts), "--out", str(tmp_path / "again.parquet")]) == 1
    assert not (tmp_path / "again.parquet").exists()


def test_a_folder_hash_is_reused_until_a_file_in_it_changes_and_then_refused(tmp_path):
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"weights")
    (folder / "sub" / "b.json").write_text("{}")
    entry = provenance.artifact_entry(folder)
    assert entry["sha256"] == provenance.sha256_of(folder) and entry["files"] == 2 and entry["size"] == 9
    provenance.record_path(folder).write_text(json.dumps({"artifact": entry}))
    assert provenance.cached_sha256(folder) == (entry["sha256"], True)
    # A record of a wrong hash with a matching stat is trusted: proof that no content was read.
    provenance.record_path(folder).write_text(json.dumps({"artifact": {**entry, "sha256": "f" * 64}}))
    assert provenance.cached_sha256(folder) == ("f" * 64, True)
    provenance.record_path(folder).write_text(json.dumps({"artifact": entry, "stage": "train_retriever"}))
    os.utime(folder / "a.bin", ns=(1, 1))  # same content, new mtime: hashed again, accepted
    assert provenance.cached_sha256(folder) == (entry["sha256"], False)
    (folder / "sub" / "c.txt").write_text("new")  # a new file: hashed again, refused
    with pytest.raises(provenance.ChangedArtifactError, match="model: changed since the 'train_retriever'"):
        provenance.cached_sha256(folder)
    (folder / "sub" / "c.txt").unlink()
    (folder / "a.bin").write_bytes(b"weightz")  # same size, new mtime and content: refused
    with pytest.raises(provenance.ChangedArtifactError, match="its bytes differ from those recorded"):
        provenance.cached_sha256(folder)
    (folder / "a.bin").unlink()  # a file gone: named
    assert "missing a.bin" in provenance.changed_since_written(folder)
    assert provenance.changed_since_written(tmp_path / "nowhere") == f"{tmp_path / 'nowhere'} is missing"


def test_after_snakemake_touches_an_output_one_job_hashes_it_and_the_next_reuse_that(tmp_path, monkeypatch):
    """Snakemake touches every output file after its job and adds .snakemake_timestamp to a folder
    output: a file is hashed once more by the first reader (which leaves a cache beside it), a
    folder keeps the producer's hash."""
    data = tmp_path / "passages.parquet"
    data.write_bytes(b"passages")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    for path in (data, folder):
        provenance.record_path(path).write_text(json.dumps({"artifact": provenance.artifact_entry(path)}))
    os.utime(data, ns=(10**18, 10**18))  # Snakemake's touch of the file
    (folder / ".snakemake_timestamp").write_text("")  # and its stamp in the folder

    hashed = []
    real = provenance.sha256_of
    monkeypatch.setattr(provenance, "sha256_of", lambda path: hashed.append(Path(path).name) or real(path))
    truth = hashlib.sha256(b"passages").hexdigest()
    assert provenance.cached_sha256(folder) == (real(folder), True)
    assert provenance.cached_sha256(data) == (truth, False)  # the first reader hashes it
    assert json.loads(provenance.hash_cache_path(data).read_text())["sha256"] == truth
    assert provenance.cached_sha256(data) == (truth, True)  # every later one reuses that
    assert hashed == ["passages.parquet"]
    # Caches and stamps are bookkeeping: not part of a folder's hash.
    (folder / "x.sha256.json").write_text("{}")
    assert real(folder) == provenance.artifact_entry(folder)["sha256"]
    assert provenance.cached_sha256(folder)[1]


def test_no_hash_cache_is_written_beside_data_no_stage_produced(tmp_path):
    data = tmp_path / "corpus.jsonl"
    data.write_text('{"_id": "d1"}\n')
    assert provenance.cached_sha256(data) == (hashlib.sha256(data.read_bytes()).hexdigest(), False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]


def test_a_rows_provenance_leaves_out_its_exports(tmp_path):
    """The report lists the records behind a row, not those of its exports (hub/, faiss/): an export
    job may rewrite those while the report is built (a changed compare.csv reruns every hub)."""
    from dprflow.evaluation.report import row_artifacts

    row = tmp_path / "tiny" / "m" / "seed-13" / "r2"
    for folder in ("model", "hub", "faiss", "embeddings"):
        (row / folder).mkdir(parents=True)
        (row / folder / provenance.FOLDER_FILE).write_text("{}")
    (row / f"run.parquet{provenance.SUFFIX}").write_text("{}")
    found = {p.relative_to(row).as_posix() for p in row_artifacts(tmp_path, "tiny", "m/r2")}
    assert found == {"model/provenance.json", "embeddings/provenance.json", "run.parquet.provenance.json"}


def test_the_results_root_is_not_hashed_only_the_files_named_in_it(tmp_path):
    """compare and report_results get the results folder to resolve paths against: hashing it would
    read every embedding of the run and race export_model rewriting a hub/ beside the report (a
    fresh-clone make test failed on r2/hub/sentence_bert_config.json vanishing mid-hash)."""
    import dataclasses

    @dataclasses.dataclass
    class Args:
        results_dir: str
        metrics_files: list
        out: str

    metrics = tmp_path / "results" / "m.parquet"
    metrics.parent.mkdir()
    metrics.write_bytes(b"metrics")
    (tmp_path / "results" / "hub").mkdir()
    (tmp_path / "results" / "hub" / "modules.json").write_text("[]")
    args = Args(str(tmp_path / "results"), [str(metrics)], str(tmp_path / "results" / "compare.csv"))
    assert provenance.input_hashes(args) == {str(metrics): hashlib.sha256(b"metrics").hexdigest()}


def counts_of_two_shards(tmp_path) -> tuple[Path, Path]:
    """Two pmi_count outputs of different passages, each with its record: two stages' outputs."""
    made = []
    for name, text in (("a", "wing lift flow"), ("b", "wing lift drag flow lift")):
        passages = passages_table(tmp_path / f"passages_{name}.parquet", text)
        out = tmp_path / name / "counts.parquet"
        out.parent.mkdir()
        assert (
            pmi_count.main(["--corpus", "passages", "--corpus-path", str(passages), "--out", str(out)]) == 0
        )
        made.append(out)
    return made[0], made[1]


def test_an_output_copied_with_its_record_to_another_place_is_refused_naming_both(tmp_path, capsys):
    """`cp b/counts.parquet* a/` (what a user does to reuse an output): the record's hash matches
    the bytes, but it was written for b; a reads as b's figures unless the record names its place."""
    a, b = counts_of_two_shards(tmp_path)
    assert provenance.read(a)["artifact"]["path"] == str(a)  # outside the working folder: absolute
    shutil.copyfile(b, a)
    shutil.copyfile(provenance.record_path(b), provenance.record_path(a))
    with pytest.raises(
        provenance.ChangedArtifactError, match="was written by the 'pmi_count' stage for"
    ) as err:
        provenance.cached_sha256(a)
    assert str(a) in str(err.value) and str(b) in str(err.value)
    assert pmi.main(["--counts", str(a), "--out", str(tmp_path / "merged.parquet")]) == 1
    assert f"for {b}, not for this place" in capsys.readouterr().err
    assert not (tmp_path / "merged.parquet").exists()
    # The original stays valid, and so does a folder copied whole with its record into another.
    assert provenance.cached_sha256(b)[0] == provenance.read(b)["artifact"]["sha256"]
    shutil.copytree(b.parent, tmp_path / "c")
    with pytest.raises(provenance.ChangedArtifactError, match=f"for {b}, not for this place"):
        provenance.cached_sha256(tmp_path / "c" / "counts.parquet")


def test_a_model_folder_copied_with_its_record_is_refused(tmp_path):
    """`rm -r r1/model && cp -r r2/model r1/model`: provenance.json comes along inside the folder."""
    r1, r2 = tmp_path / "r1" / "model", tmp_path / "r2" / "model"
    for folder, weights in ((r1, b"r1 weights"), (r2, b"r2 weights")):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(weights)
        provenance.record_path(folder).write_text(
            json.dumps({"stage": "train_retriever", "artifact": provenance.artifact_entry(folder)})
        )
    shutil.rmtree(r1)
    shutil.copytree(r2, r1)
    assert f"for {r2}, not for this place" in provenance.changed_since_written(r1)
    # A record from before records named their place is checked against its output arguments.
    record = json.loads(provenance.record_path(r1).read_text())
    del record["artifact"]["path"]
    provenance.record_path(r1).write_text(json.dumps({**record, "args": {"out": str(r2), "init": str(r1)}}))
    assert f"for {r2}, not for this place" in provenance.changed_since_written(r1)
    provenance.record_path(r1).write_text(json.dumps({**record, "args": {"out": str(r1)}}))
    assert provenance.changed_since_written(r1) is None


def test_records_inside_the_working_folder_stay_valid_when_it_is_copied_whole(tmp_path, monkeypatch):
    """A record names its output relative to the working folder: a whole workflow folder copied or
    moved elsewhere (a copy of a finished run) keeps every record valid."""
    work = tmp_path / "work"
    (work / "results").mkdir(parents=True)
    monkeypatch.chdir(work)
    passages_table(Path("results/passages.parquet"))
    argv = [
        "--corpus",
        "passages",
        "--corpus-path",
        "results/passages.parquet",
        "--out",
        "results/counts.parquet",
    ]
    assert pmi_count.main(argv) == 0
    assert provenance.read("results/counts.parquet")["artifact"]["path"] == "results/counts.parquet"
    assert provenance.read(work / "results/counts.parquet")["artifact"]["path"] == "results/counts.parquet"
    shutil.copytree(work, tmp_path / "copy", copy_function=shutil.copy2)
    monkeypatch.chdir(tmp_path / "copy")
    assert provenance.changed_since_written("results/counts.parquet") is None
    assert provenance.changed_since_written(tmp_path / "copy/results/counts.parquet") is None


def test_a_replacement_with_the_same_size_and_mtime_is_hashed_and_refused(tmp_path):
    """`touch -r old new; cp -p new old`: same name, size and mtime. The change time (and, for a
    file moved in, the inode) cannot be set by hand, so the stat differs and the bytes are hashed."""
    folder = tmp_path / "model"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"weights one")
    provenance.record_path(folder).write_text(
        json.dumps({"stage": "train_retriever", "artifact": provenance.artifact_entry(folder)})
    )
    assert provenance.cached_sha256(folder)[1]  # reused: nothing changed
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"weights two")  # the same size
    subprocess.run(["touch", "-r", str(weights), str(other)], check=True)
    # The kernel stamps ctime from a clock that ticks every few ms: let it pass the file's.
    while weights.stat().st_ctime_ns + 50_000_000 > time.time_ns():
        time.sleep(0.01)
    subprocess.run(["cp", "-p", str(other), str(weights)], check=True)
    assert weights.stat().st_mtime_ns == other.stat().st_mtime_ns  # what stat_of saw before
    with pytest.raises(provenance.ChangedArtifactError, match="its bytes differ from those recorded"):
        provenance.cached_sha256(folder)
    # A file moved in over it (a new inode), with the old mtime: hashed too.
    weights.write_bytes(b"weights one")
    provenance.record_path(folder).write_text(
        json.dumps({"stage": "train_retriever", "artifact": provenance.artifact_entry(folder)})
    )
    other.write_bytes(b"weights two")
    os.utime(other, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns))
    os.replace(other, weights)
    with pytest.raises(provenance.ChangedArtifactError, match="its bytes differ from those recorded"):
        provenance.cached_sha256(folder)
