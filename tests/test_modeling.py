"""Pooling, the bi-encoder's save/load round trips, and the cross-encoder, on a tiny random BERT."""

import json
import logging

import pytest
import torch
from transformers import AutoModel, BertConfig, BertModel

from dprflow.finetuning.biencoder import BiEncoder, length_groups
from dprflow.finetuning.cross_encoder import CrossEncoder
from dprflow.models.pooling import pool

TINY = dict(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
INPUTS = {
    "input_ids": torch.tensor([[2, 5, 7, 3, 0], [2, 9, 3, 0, 0]]),
    "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
}


def tiny_bert(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    return BertModel(BertConfig(**TINY)).eval()


def test_pool_cls_and_masked_mean():
    hidden = torch.arange(12, dtype=torch.float).view(2, 3, 2)  # [B=2, L=3, H=2]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert pool(hidden, mask, "cls").tolist() == [[0.0, 1.0], [6.0, 7.0]]
    assert pool(hidden, mask, "mean").tolist() == [[1.0, 2.0], [6.0, 7.0]]
    padded = hidden.clone()
    padded[0, 2] = 100.0
    padded[1, 1:] = -100.0
    assert torch.equal(pool(padded, mask, "mean"), pool(hidden, mask, "mean"))  # padding ignored
    with pytest.raises(ValueError, match="cls, mean"):
        pool(hidden, mask, "max")


def test_shared_biencoder_round_trip_loads_with_automodel(tmp_path):
    model = BiEncoder(tiny_bert())
    assert model.shared and model.passage_model is model.query_model
    with torch.no_grad():
        q, p = model(INPUTS, INPUTS)
    model.save_pretrained(tmp_path, extra={"learning_rate": 2e-5, "out": tmp_path})
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    saved = json.loads((tmp_path / "dprflow_encoder.json").read_text())
    extra = {"learning_rate": 2e-5, "out": str(tmp_path)}  # paths stored as strings
    assert saved == {
        "pooling": "cls",
        "similarity": "dot",
        "temperature": 1.0,
        "shared": True,
        "extra": extra,
    }

    loaded = BiEncoder.from_pretrained(tmp_path).eval()
    assert loaded.shared
    with torch.no_grad():
        assert torch.allclose(loaded.encode_query(**INPUTS), q, atol=1e-6)
        assert torch.allclose(loaded.encode_passage(**INPUTS), p, atol=1e-6)
        plain = AutoModel.from_pretrained(tmp_path).eval()
        assert torch.allclose(plain(**INPUTS).last_hidden_state[:, 0], q, atol=1e-6)


def test_separate_biencoder_round_trip(tmp_path):
    passage = tiny_bert()
    with torch.no_grad():
        for param in passage.parameters():
            param.add_(0.1 * torch.randn_like(param))
    model = BiEncoder(tiny_bert(), passage, pooling="mean")
    assert not model.shared
    with torch.no_grad():
        q, p = model(INPUTS, INPUTS)
    assert not torch.allclose(q, p, atol=1e-3)  # the towers differ

    model.save_pretrained(tmp_path)
    assert (tmp_path / "query_model" / "model.safetensors").is_file()
    assert (tmp_path / "passage_model" / "model.safetensors").is_file()
    loaded = BiEncoder.from_pretrained(tmp_path).eval()
    assert not loaded.shared and loaded.pooling == "mean"
    with torch.no_grad():
        q2, p2 = loaded(INPUTS, INPUTS)
    assert torch.allclose(q2, q, atol=1e-6) and torch.allclose(p2, p, atol=1e-6)
    with pytest.raises(ValueError, match="shared=False"):
        BiEncoder.from_pretrained(tmp_path, shared=True)


def test_from_plain_checkpoint_shared_or_copied(tmp_path):
    tiny_bert().save_pretrained(tmp_path)
    shared = BiEncoder.from_pretrained(tmp_path)
    assert shared.shared and shared.pooling == "cls" and not shared.normalize
    untied = BiEncoder.from_pretrained(tmp_path, shared=False).eval()
    assert untied.query_model is not untied.passage_model
    n_params = sum(p.numel() for p in shared.parameters())
    assert sum(p.numel() for p in untied.parameters()) == 2 * n_params
    with torch.no_grad():
        q, p = untied(INPUTS, INPUTS)
    assert torch.allclose(q, p, atol=1e-6)  # two copies of the same start


def test_saved_config_is_default_and_explicit_arguments_win(tmp_path):
    BiEncoder(tiny_bert(), pooling="mean", similarity="cosine").save_pretrained(tmp_path)
    loaded = BiEncoder.from_pretrained(tmp_path).eval()
    assert loaded.pooling == "mean" and loaded.normalize and loaded.temperature == 0.05
    with torch.no_grad():
        assert torch.allclose(loaded.encode_query(**INPUTS).norm(dim=-1), torch.ones(2), atol=1e-5)
    assert BiEncoder.from_pretrained(tmp_path, pooling="cls").pooling == "cls"
    with pytest.raises(ValueError, match="cls, mean"):
        BiEncoder.from_pretrained(tmp_path, pooling="max")


def test_biencoder_trains_and_freezes_the_unused_pooler():
    model = BiEncoder(tiny_bert())
    model.train()
    q, p = model(INPUTS, INPUTS)
    (q @ p.T).sum().backward()
    assert all(not prm.requires_grad for prm in model.query_model.pooler.parameters())
    grads = [prm.grad for prm in model.parameters() if prm.requires_grad]
    assert grads and all(g is not None for g in grads)  # no unused trainable parameter (DDP-safe)


def _ragged_batch(rows: int, width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows of random lengths 2..width, as a tokenizer pads a contrastive batch."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (rows,), generator=g)
    lengths[0] = width
    mask = (torch.arange(width) < lengths[:, None]).long()
    ids = torch.randint(4, 100, (rows, width), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_training_encodes_rows_by_length_with_the_whole_batch_s_embeddings_and_gradients(pooling):
    """In training, a batch's rows are encoded in groups of similar length (less padding): with
    dropout off, the embeddings and the gradients are the whole batch's (in float64: in float32
    the whole batch's own gradients move by more than that when its rows are permuted)."""
    batch = _ragged_batch(32, 40)
    assert length_groups(batch["attention_mask"].sum(1).tolist(), 40) is not None  # it does group
    results = []
    for grouped in (False, True):
        model = BiEncoder(tiny_bert().double(), pooling=pooling)
        for module in model.modules():  # dropout off, so both passes draw nothing
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        model.train(grouped)  # eval mode encodes whole
        _, p = model(None, batch)
        (p * torch.linspace(-1, 1, p.numel(), dtype=p.dtype).view_as(p)).sum().backward()
        grads = {n: prm.grad.clone() for n, prm in model.named_parameters() if prm.grad is not None}
        results.append((p.detach(), grads))
    (whole, whole_grads), (grouped, grouped_grads) = results
    assert torch.allclose(grouped, whole, atol=1e-10)
    assert whole_grads.keys() == grouped_grads.keys()
    for name, grad in whole_grads.items():
        assert torch.allclose(grouped_grads[name], grad, atol=1e-10, rtol=1e-7), name


def test_length_groups_sort_cut_and_round():
    lengths = [40, 3, 9, 17, 5, 33, 2, 8] * 4  # 32 rows
    groups = length_groups(lengths, 40)
    assert [len(rows) for rows, _ in groups] == [8, 8, 8, 8]
    assert sorted(i for rows, _ in groups for i in rows) == list(range(32))
    assert [length for _, length in groups] == [8, 8, 24, 40]  # longest of each, up to a multiple of 8
    for rows, length in groups:
        assert max(lengths[i] for i in rows) <= length
    assert length_groups([40] * 32, 40) is None  # nothing to save
    assert length_groups(lengths[:15], 40) is None  # too few rows for two groups of 8
    assert [len(r) for r, _ in length_groups(lengths[:20], 40)] == [10, 10]
    assert [length for _, length in length_groups(lengths, 40, multiple=1)] == [3, 8, 17, 40]


def test_left_padded_or_odd_batches_are_encoded_whole():
    batch = _ragged_batch(32, 40)
    left = {key: value.flip(1) for key, value in batch.items()}
    model = BiEncoder(tiny_bert())
    with torch.no_grad():
        model.eval()
        expected = model.encode_passage(**left)
        model.train()
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        assert torch.equal(model.encode_passage(**left), expected)  # one call, the same shapes


def test_cross_encoder_from_plain_encoder_logs_new_head_and_round_trips(tmp_path, caplog):
    tiny_bert().save_pretrained(tmp_path / "encoder")
    with caplog.at_level(logging.WARNING, logger="dprflow.finetuning.cross_encoder"):
        reranker = CrossEncoder.from_pretrained(tmp_path / "encoder").eval()
    assert "initialised at random" in caplog.text and "classifier.weight" in caplog.text
    assert set(reranker.new_parameter_names) == {"model.classifier.weight", "model.classifier.bias"}
    with torch.no_grad():
        scores = reranker(**INPUTS)
    assert scores.shape == (2,)
    reranker.save_pretrained(tmp_path / "reranker", extra={"epochs": 1})
    assert json.loads((tmp_path / "reranker" / "dprflow_reranker.json").read_text()) == {
        "extra": {"epochs": 1},
        "pooling": "cls",
    }
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dprflow.finetuning.cross_encoder"):
        loaded = CrossEncoder.from_pretrained(tmp_path / "reranker").eval()
    assert "initialised at random" not in caplog.text and loaded.new_parameter_names == ()
    with torch.no_grad():
        assert torch.allclose(loaded(**INPUTS), scores, atol=1e-6)


def test_cross_encoder_rejects_multi_label_model():
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(**TINY, num_labels=2))
    with pytest.raises(ValueError, match="num_labels=1"):
        CrossEncoder(model)


def test_mean_pooling_cross_encoder_scores_the_token_mean_and_round_trips(tmp_path):
    tiny_bert().save_pretrained(tmp_path / "encoder")
    reranker = CrossEncoder.from_pretrained(tmp_path / "encoder", pooling="mean").eval()
    with torch.no_grad():
        scores = reranker(**INPUTS)
        hidden = reranker.model.base_model(**INPUTS).last_hidden_state
        mask = INPUTS["attention_mask"].unsqueeze(-1).float()
        expected = reranker.model.classifier((hidden * mask).sum(1) / mask.sum(1)).squeeze(-1)
    torch.testing.assert_close(scores, expected)
    assert not torch.allclose(scores, CrossEncoder(reranker.model, pooling="cls").eval()(**INPUTS))
    reranker.save_pretrained(tmp_path / "reranker")
    loaded = CrossEncoder.from_pretrained(tmp_path / "reranker").eval()  # the saved pooling
    assert loaded.pooling == "mean"
    with torch.no_grad():
        torch.testing.assert_close(loaded(**INPUTS), scores)
    with pytest.raises(ValueError, match="trained with mean pooling"):
        CrossEncoder.from_pretrained(tmp_path / "reranker", pooling="cls")
