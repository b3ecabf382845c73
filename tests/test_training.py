"""The fine-tuning stages on a tiny random BERT: determinism, resume after a kill, bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import save_tiny_bert
from stage_process import run_stage
from training_helpers import argv, same_weights, weights

from dprflow.data.schemas import write_table
from dprflow.stages import train_retriever
from dprflow.training.store import code_record

ROOT = Path(__file__).resolve().parents[1]


def test_same_seed_same_weights_and_training_changes_them(train_data, tiny_init):
    assert train_retriever.main(argv(train_data, tiny_init, "a")) == 0
    assert train_retriever.main(argv(train_data, tiny_init, "b")) == 0
    assert same_weights(train_data / "a", train_data / "b")
    log = pd.read_csv(train_data / "a" / "train_log.csv")
    assert log["step"].tolist() == [1, 2, 3, 4, 5, 6]  # 12 queries / 4 per batch * 2 epochs
    kept = [p.name for p in (train_data / "a.ckpt").iterdir()]
    assert kept == ["finished"], "checkpoints are removed once the model is written; links to it stay"
    init = weights(tiny_init)
    trained = weights(train_data / "a")
    assert not torch.equal(
        init["encoder.layer.0.attention.self.query.weight"],
        trained["encoder.layer.0.attention.self.query.weight"],
    )
    # A different seed gives a different model.
    assert train_retriever.main(argv(train_data, tiny_init, "c", seed=7)) == 0
    assert not same_weights(train_data / "a", train_data / "c")


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_weights(train_data, tiny_init):
    assert train_retriever.main(argv(train_data, tiny_init, "whole")) == 0
    resumed = argv(train_data, tiny_init, "resumed")
    killed = run_stage("train_retriever", resumed, {**os.environ, "DPRFLOW_KILL_AFTER_STEP": "3"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (train_data / "resumed").exists()
    assert (train_data / "resumed.ckpt" / "step-2" / "COMPLETE").exists()
    again = run_stage("train_retriever", resumed)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stderr and "at step 2" in again.stderr
    assert same_weights(train_data / "whole", train_data / "resumed")
    a = pd.read_csv(train_data / "whole" / "train_log.csv")
    b = pd.read_csv(train_data / "resumed" / "train_log.csv")
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-6)


def test_a_rerun_on_the_same_inputs_reuses_the_finished_model(train_data, tiny_init, caplog):
    """Snakemake reruns a job whose inputs were rewritten with the same content (after a change of
    finetune.encode_shards, say): the stage puts its finished model back instead of training."""
    assert train_retriever.main(argv(train_data, tiny_init, "f")) == 0
    before = (train_data / "f" / "model.safetensors").read_bytes()
    finished = train_data / "f.ckpt" / "finished" / "model" / "model.safetensors"
    assert finished.stat().st_nlink == 1  # a copy (or reflink): the output's edits cannot reach it
    shutil.rmtree(train_data / "f")  # what Snakemake does before it reruns a job
    negatives = pd.read_parquet(train_data / "negatives.parquet")
    write_table(negatives, train_data / "negatives.parquet", "negatives")  # rewritten, same content
    caplog.clear()
    assert train_retriever.main(argv(train_data, tiny_init, "f")) == 0
    assert "reused the model this stage finished" in caplog.text and "step 1/" not in caplog.text
    assert (train_data / "f" / "model.safetensors").read_bytes() == before
    assert (train_data / "f" / "train_log.csv").exists()
    # Other content at the same path: trained again, and the log says what changed.
    write_table(negatives[negatives["rank"] <= 8], train_data / "negatives.parquet", "negatives")
    shutil.rmtree(train_data / "f")
    caplog.clear()
    assert train_retriever.main(argv(train_data, tiny_init, "f")) == 0
    assert "not reusing the finished model" in caplog.text and "negatives.parquet" in caplog.text
    assert (train_data / "f" / "model.safetensors").read_bytes() != before


def test_a_change_of_the_training_code_retrains_instead_of_reusing(train_data, tiny_init, tmp_path):
    """Issue 22 (a): Snakemake reruns a stage whose code changed; the stage must train with the new
    code, not put back the model the old code trained, nor resume a checkpoint the old code wrote.
    The stage runs from a copy of the package, which the test edits (a line added to the loss
    module the stage imports)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "dprflow", src / "dprflow", ignore=shutil.ignore_patterns("__pycache__"))
    losses = src / "dprflow" / "finetuning" / "losses.py"
    args = argv(train_data, tiny_init, "m")
    killed = run_stage("train_retriever", args, {**os.environ, "DPRFLOW_KILL_AFTER_STEP": "3"}, src=src)
    assert killed.returncode == -9, killed.stderr[-2000:]
    losses.write_text(losses.read_text() + "\nEDITED = 1\n")
    first = run_stage("train_retriever", args, src=src)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "ignoring checkpoint" in first.stderr and "finetuning/losses.py" in first.stderr
    assert "resumed from" not in first.stderr
    losses.write_text(losses.read_text() + "\nEDITED = 2\n")
    shutil.rmtree(train_data / "m")  # what Snakemake does before it reruns the job
    again = run_stage("train_retriever", args, src=src)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "not reusing the finished model" in again.stderr and "finetuning/losses.py" in again.stderr
    assert "reused the model" not in again.stderr and "step 6/6" in again.stderr


def test_the_code_record_holds_the_stage_run_as_main(monkeypatch):
    """Snakemake runs each stage as ``python -m dprflow.stages.X``: its module is ``__main__``,
    and a change to its own file (how it builds pairs, say) must retrain. The record had only the
    modules named ``dprflow.*``: the SciFact study's train_doc2query put back a model after its
    file changed (code.json listed stages/__init__.py, not stages/train_doc2query.py)."""
    main = types.ModuleType("__main__")
    main.__file__ = str(ROOT / "src" / "dprflow" / "stages" / "train_doc2query.py")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.delitem(sys.modules, "dprflow.stages.train_doc2query", raising=False)
    assert "stages/train_doc2query.py" in code_record()["files"]


def test_the_code_record_resolves_only_the_packages_own_files(monkeypatch, tmp_path):
    """A clone named ``dprflow`` (what ``git clone`` names it) puts a ``dprflow`` folder in the
    path of every module of its .venv: the record resolved all 3,000 of a training process's
    modules at each checkpoint (a training test took 2.2x as long in such a clone). Modules
    outside the package are neither resolved nor recorded."""
    outside = tmp_path / "dprflow" / ".venv" / "lib" / "torch_like.py"
    outside.parent.mkdir(parents=True)
    outside.write_text("")
    module = types.ModuleType("torch_like")
    module.__file__ = str(outside)
    monkeypatch.setitem(sys.modules, "torch_like", module)
    resolved = []
    resolve = Path.resolve
    monkeypatch.setattr(
        Path, "resolve", lambda self, *a, **k: resolved.append(str(self)) or resolve(self, *a, **k)
    )
    files = code_record()["files"]
    assert str(outside) not in resolved
    assert "training/store.py" in files and not any("torch_like" in f for f in files)


def test_a_file_replaced_in_the_store_is_not_handed_back(train_data, tiny_init, caplog):
    """Issue 22 (b): a planted file inside finished/model never becomes the output."""
    assert train_retriever.main(argv(train_data, tiny_init, "p")) == 0
    assert train_retriever.main(argv(train_data, tiny_init, "other", seed=7)) == 0
    trained = (train_data / "p" / "model.safetensors").read_bytes()
    planted = train_data / "p.ckpt" / "finished" / "model" / "model.safetensors"
    planted.unlink()
    shutil.copy(train_data / "other" / "model.safetensors", planted)
    shutil.rmtree(train_data / "p")
    caplog.clear()
    assert train_retriever.main(argv(train_data, tiny_init, "p")) == 0
    assert "not reusing the finished model" in caplog.text and "model/model.safetensors" in caplog.text
    assert "reused the model" not in caplog.text
    assert (train_data / "p" / "model.safetensors").read_bytes() == trained  # trained again, same seed


def test_an_output_edited_in_place_does_not_reach_the_store(train_data, tiny_init, caplog):
    """Issue 22 (c): writing into the output model's file (same inode) leaves the store as it was."""
    assert train_retriever.main(argv(train_data, tiny_init, "e")) == 0
    out = train_data / "e" / "model.safetensors"
    trained = out.read_bytes()
    with open(out, "r+b") as fh:  # an edit in place, as a script that patches weights does
        fh.seek(len(trained) - 64)
        fh.write(bytes(64))
    stored = train_data / "e.ckpt" / "finished" / "model" / "model.safetensors"
    assert stored.read_bytes() == trained
    shutil.rmtree(train_data / "e")
    caplog.clear()
    assert train_retriever.main(argv(train_data, tiny_init, "e")) == 0
    assert "reused the model this stage finished" in caplog.text
    assert out.read_bytes() == trained


def test_the_store_holds_tensorboard_events_packed_so_they_show_once(tmp_path):
    """Issue 27: TensorBoard finds event files by name under --logdir; the store keeps them in an
    archive, so only the output folder's copy is a run, and a put-back output has them again."""
    from dprflow.training.store import FinishedStore

    events = tmp_path / "ckpt" / "tensorboard"
    events.mkdir(parents=True)
    (events / "events.out.tfevents.1.host").write_bytes(b"scalars")
    store = FinishedStore(tmp_path / "ckpt" / "finished", "id", {"args": {}})

    def write_model(folder: Path) -> None:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"weights")

    store.keep(write_model, events, needed=7)
    assert not [p for p in store.folder.rglob("*") if "tfevents" in p.name]
    store.put_back(tmp_path / "out", needed=7)
    assert (tmp_path / "out" / "tensorboard" / "events.out.tfevents.1.host").read_bytes() == b"scalars"
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"weights"
    assert store.why_not(lambda folder: "") is None


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_the_weights_get_the_umask_s_mode_in_the_store_the_output_and_hub(train_data, tiny_init, umask, mode):
    """Issue 41 item 4f: model.safetensors was 0600 in model/, the store and hub/ (safetensors
    writes 0600 whatever the umask, and the copies kept it), so a model shared with a group could
    not be read; every other output gets 0666 less the umask."""
    import stat

    from dprflow.stages import export_model

    old = os.umask(umask)
    try:
        extra = dict(max_steps=1, method="none", role="r1")
        assert train_retriever.main(argv(train_data, tiny_init, "m", **extra)) == 0
        shutil.rmtree(train_data / "m")
        assert train_retriever.main(argv(train_data, tiny_init, "m", **extra)) == 0  # put back
        table = pd.DataFrame(
            {"collection": ["c"], "system": ["none/r1"], "split": "test", "metric": ["nDCG@10"]}
        ).assign(value=0.5, n_seeds=1, n_queries=3)
        table.to_csv(train_data / "compare.csv", index=False)
        flags = ["--compare-csv", str(train_data / "compare.csv"), "--collection", "c"]
        assert (
            export_model.main(["--model", str(train_data / "m"), *flags, "--out", str(train_data / "hub")])
            == 0
        )
    finally:
        os.umask(old)
    folders = [train_data / "m", train_data / "m.ckpt" / "finished" / "model", train_data / "hub"]
    for folder in folders:
        files = {
            p.relative_to(folder): stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()
        }
        assert Path("model.safetensors") in files, folder
        assert {p: m for p, m in files.items() if m != mode} == {}, folder


def test_a_store_whose_files_and_file_list_were_both_replaced_is_not_handed_back(tmp_path):
    """Issue 34 case 4: another store's model and its files.json copied in (each consistent with
    the other) are refused: the list's own SHA-256 is in the COMPLETE marker, with the identity."""
    from dprflow.training.store import FILES_FILE, FinishedStore

    def kept(name: str, weights: bytes) -> FinishedStore:
        store = FinishedStore(tmp_path / name / "finished", "id", {"args": {}})

        def write_model(folder: Path) -> None:
            folder.mkdir()
            (folder / "model.safetensors").write_bytes(weights)

        store.keep(write_model, None, needed=7)
        return store

    ours, theirs = kept("ours", b"our weights"), kept("theirs", b"their weights")
    assert ours.why_not(lambda folder: "") is None
    for rel in ("model/model.safetensors", FILES_FILE):
        shutil.copy(theirs.folder / rel, ours.folder / rel)
    reason = ours.why_not(lambda folder: "")
    assert reason is not None and FILES_FILE in reason


def test_disk_full_while_saving_the_final_model_keeps_the_checkpoints(
    train_data, tiny_init, monkeypatch, capsys, caplog
):
    """Issue 22 item 5: safetensors' own error for a full disk (not an OSError) while the final
    model is written is reported like every full disk, leaves no temporary folder, and the rerun
    resumes from the last checkpoint (step 4 of 6) instead of training from the start."""
    from safetensors import SafetensorError

    from dprflow import files
    from dprflow.finetuning.biencoder import BiEncoder

    save = BiEncoder.save_pretrained

    def full_at_the_end(self, out_dir, *args, **kwargs):
        save(self, out_dir, *args, **kwargs)
        if Path(out_dir).parent.name == ".finished.tmp":
            raise SafetensorError(
                'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
            )

    monkeypatch.setattr(BiEncoder, "save_pretrained", full_at_the_end)
    monkeypatch.setattr(files, "free_bytes", lambda path: 4096)
    assert train_retriever.main(argv(train_data, tiny_init, "full")) == 1
    err = capsys.readouterr().err
    assert "no space left on device while writing" in err and "finished" in err
    assert "bytes needed" in err and "4096 bytes free" in err and "Traceback" not in err
    ckpt = train_data / "full.ckpt"
    assert not [p.name for p in train_data.rglob("*.tmp")]
    assert not (train_data / "full").exists() and not (ckpt / "finished").exists()
    assert (ckpt / "step-4" / "COMPLETE").exists()
    monkeypatch.setattr(BiEncoder, "save_pretrained", save)
    caplog.clear()
    assert train_retriever.main(argv(train_data, tiny_init, "full")) == 0
    assert "resumed from" in caplog.text and "at step 4" in caplog.text
    assert train_retriever.main(argv(train_data, tiny_init, "clean")) == 0
    assert same_weights(train_data / "clean", train_data / "full")


def test_disk_full_while_writing_the_output_keeps_the_trained_model(
    train_data, tiny_init, monkeypatch, capsys, caplog
):
    """A disk that fills while the output folder is copied from the store: the error names the
    store that keeps the model, and the rerun after space is freed puts it back without training."""
    import errno

    from dprflow import files
    from dprflow.training import store

    def no_space(src, dst):
        Path(dst).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    clone = store.clone_file
    monkeypatch.setattr(store, "clone_file", no_space)
    monkeypatch.setattr(files, "free_bytes", lambda path: 4096)
    assert train_retriever.main(argv(train_data, tiny_init, "out")) == 1
    err = capsys.readouterr().err
    assert "no space left on device while writing" in err and "4096 bytes free" in err
    assert "the trained model is kept in" in err and "does not train again" in err
    assert not (train_data / "out").exists() and not [p.name for p in train_data.rglob("*.tmp")]
    assert (train_data / "out.ckpt" / "finished" / "COMPLETE").exists()
    assert not list((train_data / "out.ckpt").glob("step-*"))  # superseded by the store
    monkeypatch.setattr(store, "clone_file", clone)
    caplog.clear()
    assert train_retriever.main(argv(train_data, tiny_init, "out")) == 0
    assert "reused the model this stage finished" in caplog.text and "step 1/" not in caplog.text
    assert train_retriever.main(argv(train_data, tiny_init, "clean")) == 0
    assert same_weights(train_data / "clean", train_data / "out")


def test_a_cpu_with_native_bf16_encodes_in_bf16_when_asked(train_data, tiny_init, monkeypatch):
    """encode_corpus with --precision bf16 on a CPU whose flags say it computes bf16 natively
    (dprflow.hardware.cpu_flags given as a value): the passages run under bf16 autocast, the shard
    records it (search_dense then encodes the queries alike), and the embeddings stay near fp32's."""
    from dprflow import hardware
    from dprflow.search.dense import embeddings_precision, read_embeddings
    from dprflow.stages import encode_corpus

    monkeypatch.setattr(hardware, "cpu_flags", lambda cpuinfo=None: frozenset({"avx512_bf16"}))
    common = ["--model", str(tiny_init), "--passages", str(train_data / "passages.parquet")]
    shards = {}
    for precision in ("fp32", "bf16"):
        out = train_data / f"{precision}.parquet"
        assert encode_corpus.main([*common, "--out", str(out), "--precision", precision]) == 0
        assert embeddings_precision([str(out)]) == precision
        shards[precision] = read_embeddings(out)[1]
    fp32, bf16 = shards["fp32"], shards["bf16"]
    assert not np.array_equal(fp32, bf16)  # it ran in bf16
    cosine = (fp32 * bf16).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(bf16, axis=1)
    assert cosine.min() > 0.99, cosine


def test_the_encoding_is_the_same_for_any_number_of_shards(train_data, tiny_init):
    """Every passage is encoded in the same global batch whatever the shard count, so the shards
    together hold identical floats in identical order (the same matrix calls run: no rounding
    difference to allow for), and a search over them gives the same run."""
    from dprflow.search.dense import read_embeddings
    from dprflow.stages import encode_corpus

    passages = pd.read_parquet(train_data / "passages.parquet")
    passages["text"] = [" ".join(["topic"] * (1 + i * 7 % 11)) for i in range(len(passages))]
    passages["n_tokens"] = [2 + i * 7 % 11 for i in range(len(passages))]
    write_table(passages, train_data / "passages.parquet", "passages")

    def encoded(shards: int) -> tuple[np.ndarray, np.ndarray]:
        ids, embs = [], []
        for shard in range(shards):
            out = train_data / f"emb_{shards}_{shard}.parquet"
            common = ["--model", str(tiny_init), "--passages", str(train_data / "passages.parquet")]
            args = [*common, "--out", str(out), "--shard", str(shard), "--num-shards", str(shards)]
            assert encode_corpus.main([*args, "--batch-size", "5", "--max-length", "16"]) == 0
            i, e = read_embeddings(out)
            ids.append(i)
            embs.append(e)
        return np.concatenate(ids), np.concatenate(embs)

    ids1, emb1 = encoded(1)
    assert sorted(ids1) == sorted(passages["passage_id"])
    for shards in (3, 4):
        ids, emb = encoded(shards)
        assert (ids == ids1).all()
        assert np.array_equal(emb, emb1)


def test_checkpoint_of_other_arguments_is_not_resumed(train_data, tiny_init, caplog):
    env = {**os.environ, "DPRFLOW_KILL_AFTER_STEP": "3"}
    assert run_stage("train_retriever", argv(train_data, tiny_init, "m"), env).returncode == -9
    changed = argv(train_data, tiny_init, "m", learning_rate=5e-4)
    assert train_retriever.main(changed) == 0
    assert "ignoring checkpoint" in caplog.text


def test_queries_without_positive_or_negatives_are_counted_and_skipped(train_data, tiny_init, caplog):
    negatives = pd.read_parquet(train_data / "negatives.parquet")
    write_table(negatives[negatives["query_id"] != "q0"], train_data / "negatives.parquet", "negatives")
    qrels = pd.read_parquet(train_data / "qrels.parquet")
    write_table(qrels[qrels["query_id"] != "q1"], train_data / "qrels.parquet", "qrels")
    assert train_retriever.main(argv(train_data, tiny_init, "s", max_steps=1)) == 0
    assert "skipped_no_positive: 1" in caplog.text
    assert "skipped_empty_negative_pool: 1" in caplog.text


def test_no_usable_query_is_an_error(train_data, tiny_init, capsys):
    write_table(
        pd.DataFrame({"query_id": [], "passage_id": [], "score": np.float32([]), "rank": np.int32([])}),
        train_data / "negatives.parquet",
        "negatives",
    )
    assert train_retriever.main(argv(train_data, tiny_init, "e")) == 1
    assert "no usable training query" in capsys.readouterr().err
    assert not (train_data / "e").exists()


def test_new_weights_get_their_own_learning_rate():
    from dprflow.stage_args import TrainArgs
    from dprflow.training.trainer import parameter_groups

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 1))
    model.new_parameter_names = ("2.weight", "2.bias")
    groups = parameter_groups(model, TrainArgs(learning_rate=1e-5, head_learning_rate=1e-3, weight_decay=0.1))
    by_param = {id(p): g for g in groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert (
        by_param[id(names["2.weight"])]["lr"] == 1e-3
        and by_param[id(names["2.weight"])]["weight_decay"] == 0.1
    )
    assert (
        by_param[id(names["2.bias"])]["lr"] == 1e-3 and by_param[id(names["2.bias"])]["weight_decay"] == 0.0
    )
    assert (
        "lr" not in by_param[id(names["0.weight"])] and by_param[id(names["1.weight"])]["weight_decay"] == 0.0
    )
    assert sum(len(g["params"]) for g in groups) == len(names)
    # Without a head learning rate, one rate for all (the new weights are not singled out).
    plain = parameter_groups(model, TrainArgs(learning_rate=1e-5))
    assert all("lr" not in g for g in plain)
    model.new_parameter_names = ("missing.weight",)
    with pytest.raises(ValueError, match="missing.weight"):
        parameter_groups(model, TrainArgs(head_learning_rate=1e-3))


@pytest.mark.slow
def test_torchrun_two_gloo_processes_match_one_process(train_data, tmp_path):
    """The multi-process path the cluster rules launch (torchrun, one process per device; here
    two CPU processes on gloo) logs the same first-step loss as one process on the same global
    batch (negatives gathered across processes), and the same loss after one update."""
    init = save_tiny_bert(tmp_path / "no_dropout", dropout=0.0)
    extra = {"max_steps": 2, "precision": "fp32"}
    assert train_retriever.main(argv(train_data, init, "one", **extra)) == 0
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "dprflow.stages.train_retriever"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*cmd, *argv(train_data, init, "two", **extra)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    one = pd.read_csv(train_data / "one" / "train_log.csv")
    two = pd.read_csv(train_data / "two" / "train_log.csv")
    np.testing.assert_allclose(two["loss"].iloc[0], one["loss"].iloc[0], rtol=1e-5)
    # The second step's loss is computed with the weights after the first update. (Weights are
    # not compared one by one: Adam turns rounding noise in near-zero gradients into full steps.)
    np.testing.assert_allclose(two["loss"].iloc[1], one["loss"].iloc[1], rtol=1e-4)


def test_reranker_head_is_seeded_so_two_runs_give_the_same_weights(train_data, tiny_init):
    """The cross-encoder's new classification head is drawn after the seed is set: two runs of the
    same arguments in one process (the global generator moved on in between) match bit for bit,
    and another seed gives another head."""
    from dprflow.stages import train_reranker

    def run(out: str, seed: int) -> dict[str, torch.Tensor]:
        args = argv(train_data, tiny_init, out, max_steps=1, pooling="mean", seed=seed)
        assert train_reranker.main(args) == 0
        return weights(train_data / out)

    torch.rand(7)  # move the global generator, as other work in the same process would
    a, b, c = run("a", 13), run("b", 13), run("c", 14)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["classifier.weight"], c["classifier.weight"])


def test_a_query_longer_than_the_reranker_budget_is_cut_not_an_error(train_data, tiny_init):
    """CISI has queries of over 200 tokens: cutting only the passage cannot fit such a pair in
    max_length ("Sequence to truncate too short"), so the longer side loses tokens first, as in
    sentence-transformers' CrossEncoder; a short query stays whole."""
    from dprflow.finetuning.biencoder import load_tokenizer
    from dprflow.finetuning.reranking import tokenize_pairs
    from dprflow.stages import train_reranker

    tok = load_tokenizer(str(tiny_init))
    long_query, passage = " ".join(["topic"] * 300), " ".join(["passage"] * 300)
    batch = tokenize_pairs(tok, [long_query, "topic 3"], [passage, passage], 32)
    assert batch["input_ids"].shape == (2, 32)
    ids = batch["input_ids"][1].tolist()
    assert ids[: len(tok("topic 3")["input_ids"])] == tok("topic 3")["input_ids"]  # kept whole
    assert (batch["token_type_ids"][0] == 1).sum() > 8  # the long pair keeps some passage
    queries = pd.read_parquet(train_data / "queries.parquet")
    queries.loc[0, "text"] = long_query
    write_table(queries, train_data / "queries.parquet", "queries")
    assert train_reranker.main(argv(train_data, tiny_init, "long", max_steps=2, max_length=32)) == 0


def test_dataloader_workers_give_the_same_weights(train_data, tiny_init):
    """Batches are a function of (seed, step): built by 2 DataLoader worker processes, they train
    the same weights as when the training process builds them (dropout on: same masks too)."""
    assert train_retriever.main(argv(train_data, tiny_init, "w0", max_steps=3)) == 0
    assert train_retriever.main(argv(train_data, tiny_init, "w2", max_steps=3, num_workers=2)) == 0
    assert same_weights(train_data / "w0", train_data / "w2")


def test_retriever_gradient_cache_trains_like_the_whole_batch(train_data, tmp_path):
    """--chunk-size encodes 1 query / 1 passage at a time with the full batch's gradient: the same
    losses as the whole batch at the first step and after one update (dropout off)."""
    init = save_tiny_bert(tmp_path / "no_dropout", dropout=0.0)
    extra = {"max_steps": 2, "precision": "fp32"}
    assert train_retriever.main(argv(train_data, init, "whole", **extra)) == 0
    assert train_retriever.main(argv(train_data, init, "cached", chunk_size=1, **extra)) == 0
    whole = pd.read_csv(train_data / "whole" / "train_log.csv")
    cached = pd.read_csv(train_data / "cached" / "train_log.csv")
    np.testing.assert_allclose(cached["loss"].iloc[0], whole["loss"].iloc[0], rtol=1e-5)
    np.testing.assert_allclose(cached["loss"].iloc[1], whole["loss"].iloc[1], rtol=1e-4)
    with pytest.raises(SystemExit):
        train_retriever.main(argv(train_data, init, "bad", chunk_size=-1))


def test_reranker_accumulation_trains_like_the_whole_batch(train_data, tmp_path):
    """The reranker's list-wise loss is a mean over queries, so 2 micro-batches of 2 queries give
    the whole batch's gradient: the same losses at the first step and after one update."""
    from dprflow.stages import train_reranker

    init = save_tiny_bert(tmp_path / "no_dropout", dropout=0.0)
    extra = {"max_steps": 2, "precision": "fp32", "pooling": "mean"}
    assert train_reranker.main(argv(train_data, init, "whole", **extra)) == 0
    assert train_reranker.main(argv(train_data, init, "acc", gradient_accumulation_steps=2, **extra)) == 0
    whole = pd.read_csv(train_data / "whole" / "train_log.csv")
    acc = pd.read_csv(train_data / "acc" / "train_log.csv")
    np.testing.assert_allclose(acc["loss"], whole["loss"], rtol=1e-5)
    np.testing.assert_allclose(acc["grad_norm"], whole["grad_norm"], rtol=1e-4)
