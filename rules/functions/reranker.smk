def reranker_init():
    """finetune.reranker.init, else the initial model (INIT)."""
    return FT["reranker"]["init"] or INIT


def reranker_init_input(wildcards):
    """The reranker's initial model when it is the MLM base or a local folder."""
    return init_input(reranker_init())


def reranker_init_fingerprint(wildcards):
    """The content of a local reranker start folder (see content_fingerprint)."""
    return init_fingerprint_of(reranker_init())


def reranker_pooling():
    """The cross-encoder head's pooling: as configured, else model.pooling when the reranker
    starts from model.init; None leaves the stage to take the initial model's own (its
    sentence-transformers pooling: mean for all-MiniLM-L6-v2), else BERT's [CLS] pooler.
    """
    r = FT["reranker"]
    return r["pooling"] or (None if r["init"] else config["model"]["pooling"])


def reranker_flags(wildcards):
    r = FT["reranker"]
    pooling = reranker_pooling()
    return (
        (f"--pooling {q(pooling)} " if pooling else "")
        + f"--method {q(wildcards.method)}"
        + optim_flags(r)
        + f" --max-length {q(r['max_length'])} --head-learning-rate {q(r['head_learning_rate'])}"
        + f" --chunk-size {q(r['chunk_size'])}"
        + f" --seed {q(wildcards.seed)}"
        + f" {training_flags(config, SCHEMA)}"
    )
