def doc2query_model_input(wildcards):
    """The trained generator folder, unless config names a ready seq2seq model (an input when it
    is a local folder)."""
    if PT["doc2query"]["model"]:
        return local_paths(PT["doc2query"]["model"])
    return [result_path(wildcards.collection, "doc2query", "model")]


def doc2query_model_fingerprint(wildcards):
    """The content of a configured local generator folder (see content_fingerprint)."""
    return content_fingerprint(PT["doc2query"]["model"])


def doc2query_model(wildcards):
    return PT["doc2query"]["model"] or result_path(
        wildcards.collection, "doc2query", "model"
    )


def train_doc2query_flags(wildcards):
    d = PT["doc2query"]
    keys = [
        "max_passage_length",
        "max_query_length",
        "drop_eval_overlap",
        "validation_fraction",
        "batch_size",
        "learning_rate",
        "weight_decay",
        "warmup_ratio",
        "epochs",
        "max_steps",
    ]
    flags = f"--seed {q(FT['seed'])} {section_flags(d['train'], keys)}"
    return (
        flags
        + f" --eval-splits {' '.join(map(q, eval_splits_of(wildcards)))} {training_flags(config, SCHEMA)}"
    )


def eval_splits_of(wildcards):
    """Query splits the generator must never train on: every split but the training one."""
    spec = collection_spec(wildcards)
    return sorted({spec["eval_split"], "dev", "test"} - {spec["train_split"]})


def doc2query_flags(wildcards):
    d = PT["doc2query"]
    keys = [
        "n_queries",
        "top_p",
        "top_k",
        "max_new_tokens",
        "batch_size",
        "max_passages",
    ]
    flags = f"--seed {q(FT['seed'])} {section_flags(d, keys)} {precision_flag(config)}"
    if d["input_prefix"]:
        flags += f" --input-prefix {shlex.quote(d['input_prefix'])}"
    return flags
