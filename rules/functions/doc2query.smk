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
    train = schema_flags(config, SCHEMA, "pretrain.doc2query.train")
    flags = f"--seed {q(FT['seed'])} {train}"
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
    # model is an input, input_prefix is quoted below, train is train_doc2query's
    generation = schema_flags(
        config,
        SCHEMA,
        "pretrain.doc2query",
        passed_otherwise=("model", "input_prefix", "train"),
    )
    flags = f"--seed {q(FT['seed'])} {generation} {precision_flag(config)}"
    if d["input_prefix"]:
        flags += f" --input-prefix {shlex.quote(d['input_prefix'])}"
    return flags
