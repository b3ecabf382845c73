"""Configuration checking: JSON-schema validation with defaults and errors that name the key.

The workflow calls :func:`validate_config` when the DAG is built. Unlike a bare jsonschema error,
an unknown key is reported with its full path and the keys allowed there, a value outside an
enumeration with the values allowed, a value of a wrong type (a float such as 4.0 where the schema
says integer, which JSON Schema itself accepts, or YAML's ``.nan`` and ``.inf`` where it says
number) with the type wanted, and a value of a setting of several forms (``auto`` or an integer)
with every form.

Beyond the schema, everything that can be checked from the config alone is checked then too, each
problem naming its key (:func:`_check_values`): split shares summing to 100, the evaluation and
training splits among those a collection declares and different from each other (unless
``score_training_queries`` says otherwise), metric names that ir_measures parses, span and crop
ranges, and token lengths within the model's position limit (read offline from its
``config.json``; skipped when it cannot be read without the network), a BEIR collection's
training qrels judging some passage relevant (read up to the first that does), ``evaluate_on`` naming
other collections of the config, ``model.references`` giving distinct row names (each reference
found as the other model settings are), a ``model.init`` to be
fine-tuned that ships no sentence-transformers prompts, and an MLM base (``model.mlm``) whose
hidden size its heads divide. Where the files a setting names are checked: every setting the
schema marks ``x-model`` naming a model that can be found (:func:`_check_models`), and the MLM
base's generic corpus giving its held-out sequences and a batch (:func:`_check_generic_corpus`).
The baseline is checked
against the rows the run produces by :func:`check_baseline`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from dprflow import yamlfile
from dprflow.errors import StageError
from dprflow.models.init import MLM_INIT, model_settings
from dprflow.plan.rows import REFERENCE_PREFIX
from dprflow.pretraining.contriever import longest_view


class ConfigError(ValueError):
    """The configuration does not match config/schema.yaml."""


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top level>"


def _fill_defaults(node: Any, schema: dict) -> Any:
    """Recursively insert schema defaults for missing keys (objects) and items (arrays)."""
    if not isinstance(schema, dict):
        return node
    if isinstance(node, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in node and "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            if key in node:
                node[key] = _fill_defaults(node[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in node:
                if key not in schema.get("properties", {}):
                    node[key] = _fill_defaults(node[key], extra)
    return node


def _is_integer(checker, instance) -> bool:
    """JSON Schema's integer less the floats it also counts (4.0): a float reached a stage's
    ``int`` argument and failed there, naming the flag instead of the key."""
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(checker, instance) -> bool:
    """JSON Schema's number less YAML's ``.nan``, ``.inf`` and ``-.inf``: NaN fails every
    comparison, so no minimum stopped it, and a job then failed on it (``Invalid learning rate:
    nan``) or ended in a traceback (``bm25.k1: .inf``)."""
    if isinstance(instance, bool) or not isinstance(instance, (int, float)):
        return False
    return not isinstance(instance, float) or math.isfinite(instance)


# Draft 2020-12 with "integer" meaning a written integer (4.0 is refused naming its key) and
# "number" a finite one (.nan and .inf are refused naming their key).
Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "number": _is_number}
    ),
)


def _message(err: jsonschema.ValidationError) -> str:
    where = _path(err.absolute_path)
    if err.validator == "type":
        kinds = [err.validator_value] if isinstance(err.validator_value, str) else err.validator_value
        if "number" in kinds and isinstance(err.instance, float) and not math.isfinite(err.instance):
            others = " or ".join(_kind(k) for k in kinds if k not in ("number", "integer"))
            return f"config value {where} = {err.instance!r} must be a finite number" + (
                f" or {others}" if others else ""
            )
        return f"config value {where} = {err.instance!r} must be {' or '.join(map(_kind, kinds))}" + _hint(
            err.instance, kinds
        )
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties", {}))
        unknown = sorted(k for k in err.instance if k not in allowed)
        if allowed:
            return f"unknown config key(s) {unknown} at {where}; allowed: {', '.join(allowed)}"
    if err.validator == "enum":
        allowed = ", ".join(map(str, err.validator_value))
        return f"config value {where} = {err.instance!r} is not allowed; allowed: {allowed}"
    if err.validator in ("oneOf", "anyOf") and err.context:
        # The alternative of a mapping's or a list's own type says what is wrong inside it; a
        # single value (or none of the type of any alternative) is told the forms that are allowed
        # (a string "8" for a setting that takes auto or an integer: both forms, not "allowed: auto").
        inside = [e for e in err.context if e.validator != "type"]
        if inside and isinstance(err.instance, (dict, list)):
            return "; ".join(_message(e) for e in inside)
        forms = " or ".join(_form(alternative) for alternative in err.validator_value)
        kinds = [alternative.get("type") for alternative in err.validator_value]
        return f"config value {where} = {err.instance!r} must be {forms}" + _hint(err.instance, kinds)
    return f"config value {where}: {err.message}"


_KINDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "null": "null",
    "object": "a mapping",
    "array": "a list",
}


def _hint(value: Any, kinds: list) -> str:
    """How to write a number the way a setting takes it: 4.0 where an integer is wanted, a string
    "8" (quoted) or 1e-4 (YAML reads an exponent without a decimal point as a string) for a number."""
    if "integer" in kinds and isinstance(value, float) and value.is_integer():
        return f" (write {int(value)}, without the decimal point)"
    if not isinstance(value, str):
        return ""
    text = value.strip()
    if "integer" in kinds and re.fullmatch(r"[+-]?\d+", text):
        return f" (a string: write {text} without quotes)"
    if "number" in kinds and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        mantissa, _, exponent = text.lower().partition("e")
        if exponent and "." not in mantissa:
            return f" (a string: YAML reads {text} as text; write {mantissa}.0e{exponent})"
        return f" (a string: write {text} without quotes)"
    return ""


def _kind(kind: str) -> str:
    return _KINDS.get(kind, f"a {kind}")


def _form(schema: dict) -> str:
    """A schema alternative in words: 'auto', 'an integer >= 0', 'a string', 'a mapping with keys
    model (required), name'."""
    if "enum" in schema:
        return " or ".join(map(repr, schema["enum"]))
    kind = schema.get("type")
    if kind == "object":
        required = set(schema.get("required", ()))
        keys = [f"{k} (required)" if k in required else k for k in schema.get("properties", {})]
        return f"a mapping with keys {', '.join(keys)}"
    if not isinstance(kind, str):
        return " or ".join(map(_kind, kind)) if kind else "anything"
    words = _kind(kind)
    bounds = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))
    for key, sign in bounds:
        if key in schema:
            words += f" {sign} {schema[key]}"
    return words


def _check_sources(config: dict) -> list[str]:
    problems = []
    needs = {"beir": "path", "ir_datasets": "ir_datasets"}
    for name, spec in config.get("collections", {}).items():
        src = spec.get("source")
        for other_src, key in needs.items():
            if src == other_src and key not in spec:
                problems.append(f"collections.{name}: source {src!r} needs the key {key!r}")
            if src != other_src and key in spec:
                problems.append(f"collections.{name}: key {key!r} only applies to source {other_src!r}")
        if src != "embedded" and spec.get("max_documents") is not None:
            problems.append(f"collections.{name}: key 'max_documents' only applies to source 'embedded'")
    return problems


EMBEDDED_SPLITS = ("train", "dev", "test")


def declared_splits(spec: dict) -> list[str] | None:
    """The query splits a collection declares, or None when they cannot be known from the config
    (a BEIR folder that does not exist yet, or an ir_datasets id without a split mapping)."""
    if spec["source"] == "embedded":
        return [s for s in EMBEDDED_SPLITS if spec["split_percent"][s] > 0]
    if spec["source"] == "ir_datasets":
        return list(spec["ir_datasets"])
    qrels = Path(spec["path"]) / "qrels"
    if not qrels.is_dir():
        return None
    return [s for s in EMBEDDED_SPLITS if (qrels / f"{s}.tsv").is_file()]


def _check_splits(config: dict) -> list[str]:
    problems = []
    for name, spec in config["collections"].items():
        where = f"collections.{name}"
        if spec["evaluate_only"]:  # nothing trains on it: only the scored split matters
            splits = declared_splits(spec)
            if splits is not None and spec["eval_split"] not in splits:
                problems.append(
                    f"{where}.eval_split = {spec['eval_split']!r} is not a split of this collection; its "
                    f"splits: {', '.join(splits) or 'none'}"
                )
            continue
        if spec["source"] == "embedded":
            share = spec["split_percent"]
            if sum(share.values()) != 100:
                problems.append(
                    f"{where}.split_percent: the shares {share} sum to {sum(share.values())}, not 100"
                )
        splits = declared_splits(spec)
        for key in ("eval_split", "train_split"):
            if splits is not None and spec[key] not in splits:
                problems.append(
                    f"{where}.{key} = {spec[key]!r} is not a split of this collection; its splits: "
                    f"{', '.join(splits) or 'none'}"
                )
        if spec["eval_split"] == spec["train_split"] and not spec["score_training_queries"]:
            problems.append(
                f"{where}.eval_split and {where}.train_split are both {spec['eval_split']!r}: the "
                f"comparison would score the queries the models trained on; choose another "
                f"eval_split, or set {where}.score_training_queries: true to do it on purpose"
            )
    return problems


def _check_metrics(config: dict) -> list[str]:
    metrics = config["evaluation"]["metrics"]
    if not metrics:
        return ["evaluation.metrics is empty: name at least one ir_measures metric, e.g. [RR@10]"]
    try:
        import ir_measures
    except ImportError:  # checked by the evaluate stage then
        return []
    problems = []
    named = [(f"evaluation.metrics[{i}]", name) for i, name in enumerate(metrics)]
    for key, name in [*named, ("finetune.select.metric", config["finetune"]["select"]["metric"])]:
        try:
            ir_measures.parse_measure(name)
        except (NameError, ValueError, TypeError, SyntaxError) as exc:
            problems.append(f"{key} = {name!r} is not an ir_measures metric ({exc})")
    return problems


def _check_ranges(config: dict) -> list[str]:
    pt = config["pretrain"]
    pairs = [
        ("pretrain.cocondenser", pt["cocondenser"], "span_min", "span_max"),
        ("pretrain.mae", pt["mae"], "span_min", "span_max"),
        ("pretrain.contriever", pt["contriever"], "ratio_min", "ratio_max"),
    ]
    return [
        f"{where}.{low} = {section[low]} is above {where}.{high} = {section[high]}"
        for where, section, low, high in pairs
        if section[low] > section[high]
    ]


def model_position_limit(name: str) -> int | None:
    """The most tokens a model's position embeddings take, read offline from its config.json
    (a packaged model, a local folder, or the local Hugging Face cache); None when unknown."""
    from dprflow.models.init import cached_config_file

    path = cached_config_file(name)
    if path is None:
        return None
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    limit = cfg.get("max_position_embeddings")
    if not isinstance(limit, int):
        return None
    if cfg.get("model_type") in ("roberta", "xlm-roberta", "camembert", "longformer"):
        limit -= int(cfg.get("pad_token_id") or 1) + 1  # positions start after the padding index
    return limit


def _check_lengths(config: dict) -> list[str]:
    """Token lengths a model is fed against the limit of the model that reads them."""
    pt, ft = config["pretrain"], config["finetune"]
    cv = pt["contriever"]
    init = config["model"]["init"]
    reranker = ft["reranker"]["init"] or init
    # Stage two may start from a given checkpoint instead of stage one's model: its spans and
    # chunks are then fed to that checkpoint.
    cocondenser = pt["cocondenser"].get("init") or init
    mae = pt["mae"].get("corpus_init") or init
    lengths = [
        (init, "finetune.max_query_length", ft["max_query_length"]),
        (init, "finetune.max_passage_length", ft["max_passage_length"]),
        (init, "pretrain.condenser.max_length", pt["condenser"]["max_length"]),
        (mae, "pretrain.mae.max_length", pt["mae"]["max_length"]),
        # a span or a crop plus [CLS] and [SEP]
        (cocondenser, "pretrain.cocondenser.span_max", pt["cocondenser"]["span_max"] + 2),
        (mae, "pretrain.mae.span_max", pt["mae"]["span_max"] + 2),
        (
            init,
            "pretrain.contriever.max_doc_tokens",
            longest_view(cv["pairs"], cv["ratio_max"], cv["max_doc_tokens"]) + 2,
        ),
    ]
    # The reranker's pairs only where a row reranks (or distils from the reranker).
    stages = set(ft["stages"]).union(*ft["stages_of"].values())
    if stages & {"rerank", "distill"}:
        lengths.append((reranker, "finetune.reranker.max_length", ft["reranker"]["max_length"]))
    for ref in _references(config)[0].values():
        lengths.append((ref["model"], "finetune.max_query_length", ft["max_query_length"]))
        lengths.append((ref["model"], "finetune.max_passage_length", ft["max_passage_length"]))
    if not pt["doc2query"]["model"]:
        lengths.append(
            (
                init,
                "pretrain.doc2query.train.max_passage_length",
                pt["doc2query"]["train"]["max_passage_length"],
            )
        )
    limits = {model: _position_limit(config, model) for model in {m for m, _, _ in lengths}}
    problems = []
    for model, key, tokens in lengths:
        limit = limits[model]
        if limit is not None and tokens > limit:
            if model == MLM_INIT:
                problems.append(
                    f"{key} asks for {tokens} tokens but the MLM base (model.init {MLM_INIT!r}) has "
                    f"{limit} positions (model.mlm.max_length); lower {key} or raise model.mlm.max_length"
                )
                continue
            problems.append(
                f"{key} asks for {tokens} tokens but {model!r} has {limit} positions "
                f"(max_position_embeddings of its config.json); lower {key}"
            )
    return problems


def _position_limit(config: dict, model: str) -> int | None:
    """:func:`model_position_limit`; the MLM base's (model.init mlm) is model.mlm.max_length."""
    if model == MLM_INIT:
        return config["model"]["mlm"]["max_length"]
    return model_position_limit(model)


def _check_mlm(config: dict) -> list[str]:
    """The MLM base's architecture (model.mlm): each attention head gets hidden_size / heads
    dimensions."""
    mlm = config["model"]["mlm"]
    if mlm["hidden_size"] % mlm["heads"]:
        return [
            f"model.mlm.hidden_size = {mlm['hidden_size']} is not a multiple of model.mlm.heads = "
            f"{mlm['heads']} (each head attends with hidden_size / heads dimensions); change one of them"
        ]
    return []


def _check_paths(config: dict) -> list[str]:
    """Settings that can only name a local file or folder must name one that exists: Snakemake would
    otherwise keep an existing output whose configured input is missing (its producer's missing
    input is ignored when the output is on disk)."""
    paths = [
        (f"collections.{n}.path", s["path"])
        for n, s in config["collections"].items()
        if s["source"] == "beir"
    ]
    corpus = config["pretrain"]["generic_corpus"]
    if corpus.get("path") and corpus["source"] == "pydoc":
        return [
            f"pretrain.generic_corpus.path = {corpus['path']!r} is set, but source 'pydoc' reads no path "
            "(the installed Python's documentation); set pretrain.generic_corpus.source to jsonl or "
            "passages to read the file, or remove the path"
        ]
    if corpus.get("path"):
        paths.append(("pretrain.generic_corpus.path", corpus["path"]))
    elif corpus["source"] != "pydoc":
        return [f"pretrain.generic_corpus.path: source {corpus['source']!r} needs a path"]
    return [f"{key} = {value!r} does not exist" for key, value in paths if not Path(value).exists()]


def _judged_relevant(path: Path) -> tuple[int, bool]:
    """(judgements read, whether one has a score > 0) of a BEIR qrels file, read until the first
    relevant one (usually its first line); lines that are not judgements are left to ingest."""
    rows = 0
    with path.open("rb") as fh:
        for line in fh:
            parts = line.split(b"\t")
            try:
                score = int(parts[2])
            except (IndexError, ValueError):
                continue  # the header, or a line the ingest stage refuses naming it
            rows += 1
            if score > 0:
                return rows, True
    return rows, False


def _check_judgements(config: dict) -> list[str]:
    """A BEIR collection that trains rows judges some passage of its train_split relevant: qrels
    of only zero (or negative) scores were refused by the first training job, six jobs later. Read
    from the user's qrels file, up to its first relevant judgement; an ir_datasets collection's
    qrels are known after its download (the training job says it then)."""
    problems = []
    for name, spec in config["collections"].items():
        if spec["source"] != "beir" or spec["evaluate_only"]:
            continue
        path = Path(spec["path"]) / "qrels" / f"{spec['train_split']}.tsv"
        try:
            rows, relevant = _judged_relevant(path)
        except OSError:
            continue  # no such split: said by _check_splits
        if rows and not relevant:
            problems.append(
                f"collections.{name}.train_split = {spec['train_split']!r}: {path} judges no passage "
                f"relevant (its {rows} judgements all score 0 or less), so fine-tuning has no positive "
                "to train on; check that file's score column (relevant is > 0), choose another "
                f"train_split, or set collections.{name}.evaluate_only: true to only score it"
            )
    return problems


def _check_transfer(config: dict) -> list[str]:
    """evaluate_on names other collections of the config; an evaluate-only collection names none
    (nothing is trained on it to transfer)."""
    problems = []
    names = list(config["collections"])
    for name, spec in config["collections"].items():
        where = f"collections.{name}.evaluate_on"
        if spec["evaluate_only"] and spec["evaluate_on"]:
            problems.append(
                f"{where}: collection {name!r} is evaluate_only, so no row is trained on it to score "
                "elsewhere; remove evaluate_on or evaluate_only"
            )
        for i, target in enumerate(spec["evaluate_on"]):
            if target == name:
                problems.append(
                    f"{where}[{i}] = {target!r} is the collection itself (its rows are scored on it anyway)"
                )
            elif target not in names:
                problems.append(
                    f"{where}[{i}] = {target!r} is not a collection of this config; its collections: "
                    f"{', '.join(names)}"
                )
    trained = [m for m in config["methods"] if m != "none"]
    if trained and all(spec["evaluate_only"] for spec in config["collections"].values()):
        problems.append(
            f"methods {trained} pre-train and fine-tune on a collection, but every collection is "
            f"evaluate_only ({', '.join(names)}): nothing would be trained; set evaluate_only: false "
            "on the collection to train on, or methods: [none] to score the initial model and "
            "model.references only"
        )
    return problems


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)


def _references(config: dict) -> tuple[dict[str, dict[str, Any]], list[str]]:
    out: dict[str, dict[str, Any]] = {}
    problems = []
    for i, entry in enumerate(config["model"]["references"]):
        spec = {"model": entry} if isinstance(entry, str) else dict(entry)
        name = spec.get("name") or _slug(Path(spec["model"].rstrip("/")).name or spec["model"])
        row = REFERENCE_PREFIX + name
        if row in out:
            problems.append(
                f"model.references[{i}] ({spec['model']!r}) and an earlier reference "
                f"({out[row]['model']!r}) are both named {row!r}; give one a name: {{model: ..., name: ...}}"
            )
        out[row] = {
            "model": spec["model"],
            "pooling": spec.get("pooling"),
            "similarity": spec.get("similarity"),
        }
    return out, problems


def reference_models(config: dict) -> dict[str, dict[str, Any]]:
    """``model.references`` as ``{row method: {"model", "pooling", "similarity"}}``: each row is
    named ``ref-<name>``, its ``name``, else the last part of its id or path with characters other
    than letters, digits, '-' and '_' made '-' (``BAAI/bge-small-en-v1.5`` -> ``ref-bge-small-en-v1-5``).
    Two references of one name are an error naming both (checked by :func:`validate_config`)."""
    out, problems = _references(config)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    return out


def _check_prompts(config: dict) -> list[str]:
    """A model.init that ships sentence-transformers prompts cannot be fine-tuned (the stages do
    not add them): said when the DAG is built, not when retriever 1 starts. Read offline, from a
    packaged model or a local folder only."""
    if all(spec["evaluate_only"] for spec in config["collections"].values()):
        return []  # nothing is trained: its off-the-shelf row uses the prompts
    from dprflow.models.init import PACKAGED_MODELS, resolve_model
    from dprflow.models.st_format import read_st_prompts

    init = config["model"]["init"]
    if init == MLM_INIT or (init not in PACKAGED_MODELS and not Path(init).expanduser().is_dir()):
        return []  # the MLM base is a plain BERT, without prompts
    try:
        prompts = read_st_prompts(resolve_model(init))
    except ValueError as exc:
        return [f"model.init: {exc}"]
    if any(prompts.values()):
        return [
            f"model.init = {init!r} puts prompts before its inputs ({prompts}); fine-tuning does not add "
            "them: start from a model without prompts, or score this one off the shelf (model.references, "
            "or collections marked evaluate_only)"
        ]
    return []


def _get(config: dict, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def looks_like_path(value: str) -> bool:
    """A value written as a file-system path (absolute, relative with ./ or ../, under ~, or with
    more than one '/'), which a hub id (``name`` or ``org/name``) never is."""
    return value.startswith(("/", "./", "../", "~")) or value.count("/") > 1 or value.endswith("/")


def _model_values(config: dict, keys: tuple[str, ...]) -> list[tuple[str, Any]]:
    """``(key, value)`` of each setting that names a model (``keys``, from the schema's x-model
    marks) where the config uses it: each entry of model.references; model.mlm.tokenizer only for
    the MLM base (model.init mlm), whose name is no model to find (its vocabulary is)."""
    mlm_base = config["model"]["init"] == MLM_INIT
    settings = []
    for key in keys:
        value = _get(config, key)
        if key == "model.references":
            settings += [
                (f"{key}[{i}]", r if isinstance(r, str) else r["model"]) for i, r in enumerate(value)
            ]
        elif key == "model.mlm.tokenizer" and not mlm_base:
            continue  # unused
        elif not (key == "model.init" and mlm_base):
            settings.append((key, value))
    return settings


def _check_models(config: dict, keys: tuple[str, ...]) -> list[str]:
    """Every setting that names a model (``keys``) names one that can be found without the network
    where that can be known now: a packaged model whose package is installed, a local folder that
    exists and holds a config.json, or a hub id in the local cache when the hub is switched off
    (``HF_HUB_OFFLINE``); a hub id otherwise is checked by the job that loads it. null (the
    setting's default: model.init, or a stage run here) is not looked for; mlm names the MLM base
    in model.init only."""
    from dprflow.models.init import OFFLINE_VARIABLES, PACKAGED_MODELS, hub_cache_file, resolve_model

    offline = [
        v for v in OFFLINE_VARIABLES if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
    ]
    problems = []
    for key, value in _model_values(config, keys):
        if not value:
            continue
        if value == MLM_INIT:
            problems.append(
                f"{key} = {value!r}: only model.init names the MLM base (model.init: {MLM_INIT}); write "
                f"./{MLM_INIT} for a local folder named {MLM_INIT}"
            )
        elif value in PACKAGED_MODELS or Path(value).expanduser().exists():
            try:
                resolve_model(value)
            except ValueError as exc:
                problems.append(f"{key} = {value!r}: {exc}")
        elif looks_like_path(value):
            problems.append(f"{key} = {value!r} does not exist (a local model folder was expected)")
        elif offline and hub_cache_file(value, "config.json") is None:
            problems.append(
                f"{key} = {value!r} is not a local folder, a packaged model ({', '.join(PACKAGED_MODELS)}) "
                f"or in the local Hugging Face cache, and {offline[0]} is set: download it once with the "
                "network, or name a local folder"
            )
    return problems


# Texts of the generic corpus read at most by the config check: a corpus that gives the MLM base
# enough sequences shows it in its first texts; past this much the job counts exactly.
GENERIC_CHECK_BYTES = 64 << 20


def _check_generic_corpus(config: dict) -> list[str]:
    """The MLM base (model.init mlm) trains on the generic corpus less its last
    model.mlm.heldout_sequences sequences, at least one batch (model.mlm.batch_size): a corpus
    that cannot give that many was refused by the fifth job. Without a tokenizer, a text's tokens
    lie between its words (a word is at least one token) and its UTF-8 bytes (a token is at least
    one byte), and so do its sequences (:func:`dprflow.pretraining.mlm.sequences_of`): the texts
    are read until the words give enough (usually the first few hundred), and the corpus is
    refused when even its bytes cannot; a corpus in between, or larger than
    :data:`GENERIC_CHECK_BYTES`, is counted exactly by the job, whose message names the file."""
    if config["model"]["init"] != MLM_INIT:
        return []
    from dprflow.pretraining.documents import iter_generic_texts
    from dprflow.pretraining.mlm import sequences_of

    corpus, mlm = config["pretrain"]["generic_corpus"], config["model"]["mlm"]
    source, path = corpus["source"], corpus.get("path")
    if source != "pydoc" and not (path and Path(path).exists()):
        return []  # said by _check_paths
    need = mlm["heldout_sequences"] + mlm["batch_size"]
    least = most = read = 0
    try:
        for text in iter_generic_texts(source, path):
            least += sequences_of(len(text.split()), mlm["max_length"])
            size = len(text.encode("utf-8"))
            most += sequences_of(size, mlm["max_length"])
            read += size
            if least >= need or read > GENERIC_CHECK_BYTES:
                return []
    except (OSError, ValueError, StageError) as exc:
        return [f"pretrain.generic_corpus.path = {path!r} cannot be read: {exc}"]
    if most >= need:
        return []
    named = (
        f"pretrain.generic_corpus.path = {path!r}"
        if path
        else f"pretrain.generic_corpus.source = {source!r} (the installed Python's documentation)"
    )
    lower = (
        "lower model.mlm.heldout_sequences or model.mlm.batch_size (each at least 1, their sum at most "
        f"{most}), or "
        if most >= 2
        else ""
    )
    return [
        f"{named} gives at most {most} sequences of model.mlm.max_length = {mlm['max_length']} tokens, "
        f"fewer than the MLM base (model.init: {MLM_INIT}) needs: model.mlm.heldout_sequences = "
        f"{mlm['heldout_sequences']} held out plus one batch of model.mlm.batch_size = {mlm['batch_size']}; "
        f"{lower}use a larger corpus (`make generic-corpus` writes data/generic/debian-docs.jsonl, then "
        "set pretrain.generic_corpus: {source: jsonl, path: data/generic/debian-docs.jsonl})"
    ]


def _check_passage_length(config: dict) -> list[str]:
    """Passages longer than the encoder reads would be cut silently when encoded."""
    tokens, limit = config["passages"]["max_tokens"], config["finetune"]["max_passage_length"]
    if tokens <= limit:
        return []
    return [
        f"passages.max_tokens = {tokens} is above finetune.max_passage_length = {limit}: passages "
        f"would be cut to {limit} tokens when encoded; lower passages.max_tokens or raise "
        "finetune.max_passage_length"
    ]


def _check_stages(config: dict) -> list[str]:
    """finetune.stages_of, seeds_of and finetune.select.by name methods of the config."""
    methods = config["methods"]
    named = [(f"finetune.stages_of.{m}", m) for m in config["finetune"]["stages_of"]]
    split = {key: key.partition("/") for key in config["seeds_of"]}  # a method, or <method>/<stage>
    named += [(f"seeds_of.{key}", method) for key, (method, _, _) in split.items()]
    by = config["finetune"]["select"]["by"]
    if by is not None:
        named.append(("finetune.select.by", by))
    problems = [
        f"{key}: {method!r} is not one of the config's methods ({', '.join(methods)})"
        for key, method in named
        if method not in methods
    ]
    for key, (method, _, stage) in split.items():
        own = config["finetune"]["stages_of"].get(method, config["finetune"]["stages"])
        if method in methods and stage and stage not in own:
            problems.append(
                f"seeds_of.{key}: {method} fine-tunes no {stage!r} row (its stages: {', '.join(own)})"
            )
    return problems


def _check_values(config: dict, model_keys: tuple[str, ...], check_paths: bool = True) -> list[str]:
    files = (
        _check_paths(config)
        + _check_models(config, model_keys)
        + _check_judgements(config)
        + _check_generic_corpus(config)
        if check_paths
        else []
    )
    return (
        _check_transfer(config)
        + _check_stages(config)
        + _references(config)[1]
        + _check_prompts(config)
        + files
        + _check_passage_length(config)
        + _check_splits(config)
        + _check_metrics(config)
        + _check_ranges(config)
        + _check_mlm(config)
        + _check_lengths(config)
    )


def check_baseline(config: dict, rows: list[str]) -> None:
    """``evaluation.baseline`` and ``evaluation.also_against`` name rows of the comparison the run
    produces."""
    named = [("evaluation.baseline", config["evaluation"]["baseline"])]
    named += [
        (f"evaluation.also_against[{i}]", r) for i, r in enumerate(config["evaluation"]["also_against"])
    ]
    for key, row in named:
        if row not in rows:
            raise ConfigError(
                f"invalid configuration:\n  {key} = {row!r} is not a row of this run's comparison; its rows: "
                f"{', '.join(rows)}"
            )


def validate_config(config: dict, schema_path: str | Path, check_paths: bool = True) -> dict:
    """Fill defaults into ``config`` (in place) and check it; raise :class:`ConfigError` listing every problem.

    ``check_paths=False`` leaves out the checks that need the files a setting names (collection
    folders, corpora, local models): for checking a config written for another machine."""
    schema = yamlfile.load(schema_path)
    _fill_defaults(config, schema)
    validator = Validator(schema)
    problems = [
        _message(e) for e in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.path)))
    ]
    if not problems:
        problems = _check_sources(config)
    if not problems:
        problems = _check_values(config, model_settings(schema), check_paths)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    return config


def read_config_file(path: str | Path) -> dict:
    """A config file's mapping; malformed YAML is a :class:`ConfigError` naming the file, line
    and column (Snakemake itself only says that some config file is not valid JSON or YAML)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and start is not None and start is not mark:
            problem += f" ({context}, which starts at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file holds a mapping of keys, not a {type(data).__name__}")
    return data


def load_config(path: str | Path, schema_path: str | Path, check_paths: bool = True) -> dict:
    """Read and validate a config file (for scripts and tests; the workflow uses Snakemake's configfile)."""
    return validate_config(read_config_file(path), schema_path, check_paths)


def main(argv: list[str] | None = None) -> int:
    """``python -m dprflow.config FILE...``: check that each config file parses (file, line and
    column of the first error). The Makefile runs it before Snakemake reads the files."""
    import sys

    files = sys.argv[1:] if argv is None else argv
    status = 0
    for path in files:
        try:
            read_config_file(path)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
