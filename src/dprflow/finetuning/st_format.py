"""The sentence-transformers folder format, read and written, and the model cards of trained models.

sentence-transformers is the field's standard way to ship an embedding model: beside the Hugging
Face files, ``modules.json`` lists the modules a text goes through (``Transformer`` -> ``Pooling``
-> optionally ``Normalize``), ``1_Pooling/config.json`` says how token vectors are pooled, and
``config_sentence_transformers.json`` names the similarity function (``similarity_fn_name``;
sentence-transformers takes ``cosine`` when it is missing). all-MiniLM-L6-v2, for instance, ships
``Transformer -> Pooling(mean) -> Normalize`` and is used with cosine similarity.

- :func:`read_st_settings` reads the pooling and similarity a model ships with, so the off-the-shelf
  rows use a model as its authors do and fine-tuning starts from the geometry it was trained in.
- :func:`read_st_prompts` reads the prompts (text put before a query or a passage) a model ships
  with, so that an off-the-shelf row feeds it what ``encode_query`` and ``encode_document`` do.
- :func:`write_st_files` makes a trained bi-encoder folder a sentence-transformers model as well
  (``SentenceTransformer(path)`` gives the stage's own embeddings); :func:`write_cross_encoder_files`
  does the same for the reranker (``CrossEncoder(path)`` gives the stage's own scores).
- :func:`write_model_card` writes the ``README.md`` of a trained model.

The files use the module names every sentence-transformers version reads
(``sentence_transformers.models.*``), except the mean-pooled reranker, which only the modular
``CrossEncoder`` of sentence-transformers 6 can express.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

POOLINGS = ("cls", "mean")
SIMILARITIES = ("dot", "cosine")

# Contrastive softmax temperature by similarity when none is configured: 1 for the raw dot product
# (DPR, coCondenser eq. 13-14, query-as-context §3.2: tau = 1); 0.05 for cosine, which is bounded
# by 1 and needs a scale (sentence-transformers' MultipleNegativesRankingLoss, which trained
# all-MiniLM-L6-v2, multiplies cosine similarities by scale = 20, i.e. temperature 1/20).
DEFAULT_TEMPERATURE = {"dot": 1.0, "cosine": 0.05}

MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
SBERT_CONFIG_FILE = "sentence_bert_config.json"
POOLING_DIR = "1_Pooling"
CARD_FILE = "README.md"

# 1_Pooling/config.json: the legacy boolean keys (read by every version) and 6.x's pooling_mode.
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_MODULE_KINDS = ("Transformer", "Pooling", "Normalize")


def check_choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed: {', '.join(allowed)}")
    return value


def default_temperature(similarity: str) -> float:
    return DEFAULT_TEMPERATURE[check_choice(similarity, SIMILARITIES, "similarity")]


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc


def _module_kind(entry: dict[str, Any], file: Path, index: int) -> str:
    kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
    if kind not in _MODULE_KINDS:
        raise ValueError(
            f"{file}: module {index} is {entry.get('type')!r}; a dprflow bi-encoder is "
            f"{' -> '.join(_MODULE_KINDS)} only (set the pooling and similarity in the config to use "
            "the transformer without it)"
        )
    return kind


def _pooling_mode(file: Path) -> str:
    cfg = _read_json(file)
    if "pooling_mode" in cfg:  # sentence-transformers >= 6
        mode = cfg["pooling_mode"]
    else:
        modes = [name for key, name in _LEGACY_POOLING_KEYS.items() if cfg.get(key)]
        if len(modes) != 1:
            raise ValueError(
                f"{file}: expected exactly one pooling_mode_* key set to true, found {modes or 'none'}"
            )
        mode = modes[0]
    if mode not in POOLINGS:
        raise ValueError(f"{file}: pooling mode {mode!r} is not one of dprflow's ({', '.join(POOLINGS)})")
    return mode


def read_st_settings(path: str | Path) -> dict[str, str] | None:
    """The pooling and similarity of a sentence-transformers folder; ``None`` when it has no ``modules.json``.

    Returns ``{"pooling": "cls"|"mean", "similarity": "dot"|"cosine"}``. A ``Normalize`` module
    makes the embeddings unit vectors, so their dot product is the cosine; without one, the
    similarity is ``config_sentence_transformers.json``'s ``similarity_fn_name``, or cosine (the
    library's default) when that is missing. Modules or modes a dprflow bi-encoder cannot
    reproduce (a ``Dense`` layer, max pooling, euclidean similarity) are errors naming the file.
    """
    root = Path(path)
    file = root / MODULES_FILE
    if not file.is_file():
        return None
    modules = _read_json(file)
    if not isinstance(modules, list) or not modules:
        raise ValueError(f"{file}: expected a non-empty list of modules")
    kinds = [_module_kind(entry, file, i) for i, entry in enumerate(modules)]
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise ValueError(f"{file}: modules {kinds}; expected Transformer -> Pooling [-> Normalize]")
    if modules[0].get("path", "") not in ("", "."):
        raise ValueError(
            f"{file}: the Transformer lives in {modules[0]['path']!r}; dprflow loads the weights from "
            f"{root} itself (point model.init at {root / modules[0]['path']})"
        )
    pooling = _pooling_mode(root / modules[1].get("path", POOLING_DIR) / "config.json")
    if "Normalize" in kinds:
        return {"pooling": pooling, "similarity": "cosine"}
    st_config = root / ST_CONFIG_FILE
    name = (_read_json(st_config) if st_config.is_file() else {}).get("similarity_fn_name") or "cosine"
    if name not in SIMILARITIES:
        raise ValueError(
            f"{st_config}: similarity_fn_name {name!r} is not one of dprflow's ({', '.join(SIMILARITIES)})"
        )
    return {"pooling": pooling, "similarity": name}


QUERY_PROMPT = "query"
# sentence-transformers' encode_document takes the first of these its prompts have
PASSAGE_PROMPTS = ("document", "passage", "corpus")


def read_st_prompts(path: str | Path) -> dict[str, str]:
    """The prompts a sentence-transformers folder puts before its inputs: ``{"query": ...,
    "passage": ...}``, ``""`` where it has none.

    As ``SentenceTransformer.encode_query`` and ``encode_document`` look for them:
    ``prompts["query"]`` for a query and the first of ``prompts["document"]``, ``["passage"]``,
    ``["corpus"]`` for a passage, among the prompts the folder names; a side without one gets
    ``default_prompt_name``'s prompt. (sentence-transformers 6 adds an empty ``"document"`` prompt
    to every model it loads, so its ``encode_document`` skips a ``"passage"`` prompt; the model's
    card then says ``prompt_name="passage"``, which is what is used here.) The
    prompt is put before the text as it is (``prompt + text``). A folder whose ``Pooling`` leaves
    the prompt's tokens out (``include_prompt: false``, e.g. INSTRUCTOR) is refused, naming the
    file: dprflow pools every token and would give other embeddings than the model's own.
    """
    root = Path(path)
    file = root / ST_CONFIG_FILE
    cfg = _read_json(file) if file.is_file() else {}
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ValueError(f"{file}: 'prompts' must map prompt names to strings, got {prompts!r}")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(
            f"{file}: default_prompt_name {default!r} is not one of its prompts ({', '.join(prompts) or 'none'})"
        )
    fallback = prompts[default] if default else ""
    chosen = {
        "query": prompts.get(QUERY_PROMPT, fallback),
        "passage": next((prompts[n] for n in PASSAGE_PROMPTS if n in prompts), fallback),
    }
    if any(chosen.values()) and (root / MODULES_FILE).is_file():
        modules = _read_json(root / MODULES_FILE)
        for entry in modules if isinstance(modules, list) else []:
            if str(entry.get("type", "")).endswith("Pooling"):
                pooling_file = root / entry.get("path", POOLING_DIR) / "config.json"
                if pooling_file.is_file() and _read_json(pooling_file).get("include_prompt") is False:
                    raise ValueError(
                        f"{pooling_file}: include_prompt is false (the prompts {chosen} are left out of "
                        "the pooling); dprflow pools every token, so it cannot reproduce this model's "
                        "embeddings: use another model"
                    )
    return chosen


def with_prompt(texts: list[str], prompt: str) -> list[str]:
    """``prompt + text`` for each text, as sentence-transformers feeds a prompted model."""
    return [prompt + t for t in texts] if prompt else list(texts)


def _dump(file: Path, record: Any) -> None:
    file.write_text(json.dumps(record, indent=2) + "\n")


def _pooling_config(pooling: str, dimension: int) -> dict[str, Any]:
    record: dict[str, Any] = {"word_embedding_dimension": dimension}
    record.update({key: name == pooling for key, name in _LEGACY_POOLING_KEYS.items()})
    return record


def write_st_files(
    out: str | Path, pooling: str, similarity: str, dimension: int, max_seq_length: int
) -> None:
    """Make the Hugging Face folder ``out`` a sentence-transformers bi-encoder too.

    ``Transformer`` (the weights at the root) -> ``Pooling`` (``pooling``) -> ``Normalize`` when
    ``similarity`` is cosine, and ``similarity_fn_name`` so that ``model.similarity`` scores as the
    stage does. One ``max_seq_length`` serves queries and passages (dprflow cuts them apart).
    """
    check_choice(pooling, POOLINGS, "pooling")
    check_choice(similarity, SIMILARITIES, "similarity")
    root = Path(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"},
    ]
    if similarity == "cosine":
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
        (root / "2_Normalize").mkdir(exist_ok=True)
    _dump(root / MODULES_FILE, modules)
    (root / POOLING_DIR).mkdir(exist_ok=True)
    _dump(root / POOLING_DIR / "config.json", _pooling_config(pooling, dimension))
    _dump(root / SBERT_CONFIG_FILE, {"max_seq_length": max_seq_length, "do_lower_case": False})
    _dump(
        root / ST_CONFIG_FILE,
        {
            "model_type": "SentenceTransformer",
            "similarity_fn_name": similarity,
            "prompts": {},
            "default_prompt_name": None,
        },
    )


def write_cross_encoder_files(
    out: str | Path, pooling: str, dimension: int, head_state: dict[str, Any] | None
) -> None:
    """Make a saved reranker folder load with sentence-transformers' ``CrossEncoder``, raw scores.

    The scores are the head's logits (``activation_fn`` Identity; ``CrossEncoder`` would otherwise
    apply a sigmoid, which keeps the order but not the values).

    ``cls``: the folder is a plain ``AutoModelForSequenceClassification`` (pooler over [CLS], then
    the linear head); ``config.json`` must already carry ``sentence_transformers.activation_fn``
    (set by the caller before ``save_pretrained``), the key every ``CrossEncoder`` version reads.

    ``mean``: ``AutoModelForSequenceClassification`` cannot express a head on the mean of the
    tokens (it always reads the pooler), so the folder also holds the modules of
    sentence-transformers 6's modular ``CrossEncoder``: ``Transformer`` (feature extraction) ->
    ``Pooling(mean)`` -> ``Dense(H -> 1, Identity)`` with the head's weights (``head_state``,
    ``weight`` and ``bias`` of the linear classifier).
    """
    check_choice(pooling, POOLINGS, "pooling")
    root = Path(out)
    if pooling == "cls":
        return
    from safetensors.torch import save_file

    modules = [
        {
            "idx": 0,
            "name": "0",
            "path": "",
            "type": "sentence_transformers.base.modules.transformer.Transformer",
        },
        {
            "idx": 1,
            "name": "1",
            "path": POOLING_DIR,
            "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
        },
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.base.modules.dense.Dense"},
    ]
    _dump(root / MODULES_FILE, modules)
    (root / POOLING_DIR).mkdir(exist_ok=True)
    _dump(
        root / POOLING_DIR / "config.json",
        {"embedding_dimension": dimension, "pooling_mode": "mean", "include_prompt": True},
    )
    (root / "2_Dense").mkdir(exist_ok=True)
    _dump(
        root / "2_Dense" / "config.json",
        {
            "in_features": dimension,
            "out_features": 1,
            "bias": True,
            "activation_function": "torch.nn.modules.linear.Identity",
            "module_input_name": "sentence_embedding",
            "module_output_name": "scores",
        },
    )
    assert head_state is not None, "mean pooling needs the head's weights"
    save_file(
        {
            "linear.weight": head_state["weight"].detach().contiguous().cpu(),
            "linear.bias": head_state["bias"].detach().contiguous().cpu(),
        },
        root / "2_Dense" / "model.safetensors",
    )
    _dump(
        root / SBERT_CONFIG_FILE,
        {
            "transformer_task": "feature-extraction",
            "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
            "module_output_name": "token_embeddings",
        },
    )
    _dump(
        root / ST_CONFIG_FILE,
        {
            "model_type": "CrossEncoder",
            "activation_fn": "torch.nn.modules.linear.Identity",
            "prompts": {},
            "default_prompt_name": None,
        },
    )


# ---- model cards ---------------------------------------------------------------------------------

# The pre-training each method's encoder went through, with its paper.
METHOD_PAPERS = {
    "none": "no pre-training: the initial model itself",
    "condenser": "Condenser (Gao & Callan, EMNLP 2021, 'Condenser: a Pre-training Architecture for Dense Retrieval')",
    "cocondenser": "coCondenser (Gao & Callan, ACL 2022, 'Unsupervised Corpus Aware Language Model Pre-training for Dense Passage Retrieval')",
    "contriever": "Contriever (Izacard et al., TMLR 2022, 'Unsupervised Dense Information Retrieval with Contrastive Learning')",
    "bmae": "bottlenecked masked auto-encoder, the baseline of CDMAE ('Challenging Decoder helps in Masked Auto-Encoder Pre-training for Dense Passage Retrieval', section 3.1)",
    "cdmae": "CDMAE ('Challenging Decoder helps in Masked Auto-Encoder Pre-training for Dense Passage Retrieval', section 3.2)",
    "cotmae": "CoT-MAE (Wu et al., AAAI 2023, 'ConTextual Masked Auto-Encoder for Dense Passage Retrieval'), as in query-as-context section 2.2",
    "qac-cocondenser": "query-as-context pre-training on coCondenser (Wu et al., EMNLP 2023, 'Query-as-context Pre-training for Dense Passage Retrieval', section 3.2)",
    "qac-cotmae": "query-as-context pre-training on CoT-MAE (Wu et al., EMNLP 2023, 'Query-as-context Pre-training for Dense Passage Retrieval', section 3.2)",
}
ROLES = {
    "r1": "retriever 1: contrastive fine-tuning on BM25 negatives (coCondenser section 4.1, CDMAE section 3.4)",
    "r2": "retriever 2: contrastive fine-tuning on hard negatives mined with retriever 1 (coCondenser section 4.1)",
    "distill": "distilled retriever: KL to the cross-encoder reranker's scores plus the contrastive loss (CDMAE section 3.4, eq. 11)",
    "rerank": "cross-encoder reranker: list-wise loss over each query's group of retriever-2 candidates (CDMAE section 3.4)",
}


def write_model_card(out: str | Path, record: dict[str, Any], lines: list[str]) -> None:
    """Write ``README.md``: what the model is (``record``: method, role, init, training data and
    steps), how to load it (``lines``, Markdown), and where its metrics are."""
    method = record.get("method") or "unknown"
    role = record.get("role") or "unknown"
    queries = record.get("training_queries")
    steps = (
        f"{record.get('max_steps')} optimizer steps"
        if record.get("max_steps")
        else f"{record.get('epochs')} epoch(s)"
    )
    card = [
        "---",
        "library_name: sentence-transformers",
        f"base_model: {record.get('init')}",
        "tags: [dprflow, dense-retrieval]",
        "---",
        "",
        f"# dprflow {method} {role}",
        "",
        f"- **Stage:** {ROLES.get(role, role)}.",
        f"- **Pre-training method:** {METHOD_PAPERS.get(method, method)}.",
        f"- **Started from:** `{record.get('init')}`.",
        f"- **Training data:** queries `{record.get('queries')}` (split `{record.get('split')}`), qrels "
        f"`{record.get('qrels')}`, passages `{record.get('passages')}`, negatives `{record.get('negatives')}`"
        + (f", teacher scores `{record['teacher']}`" if record.get("teacher") else "")
        + (f"; training queries used: {json.dumps(queries, sort_keys=True)}" if queries else "")
        + ".",
        f"- **Steps:** {steps} of {record.get('batch_size')} queries x {record.get('group_size')} passages, "
        f"learning rate {record.get('learning_rate')}, seed {record.get('seed')}; the per-step loss is in "
        "`train_log.csv` beside this file, every training argument in the dprflow JSON file.",
        "- **Metrics:** the run's comparison table, `results/compare.md` (and `compare.csv`), row "
        f"`{method}/seed-{record.get('seed')}/{role}`.",
        "",
        *lines,
        "",
    ]
    (Path(out) / CARD_FILE).write_text("\n".join(card))
