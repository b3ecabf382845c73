def training_split(wildcards):
    """The split a retriever trains on: a grid point's is the fit part of the held-out split."""
    return (
        "fit"
        if SELECTION.trains_on_fit(wildcards)
        else COLLECTIONS.train_split(wildcards)
    )


def reranker_split(wildcards):
    """The split a reranker trains on: a grid point's is the fit part of the held-out split."""
    return (
        "fit"
        if SELECTION.is_reranker_point(wildcards)
        else COLLECTIONS.train_split(wildcards)
    )


def fit_or_training_split(wildcards):
    """The split a teacher labels: the fit part's on the fit part (select/rerank)."""
    return (
        "fit"
        if wildcards.scorer.startswith("select/")
        else COLLECTIONS.train_split(wildcards)
    )
