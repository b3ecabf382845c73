def fit_or_training_split(wildcards):
    """The split a training or labelling job reads: a grid point's (its folder in the seed's,
    the retriever's `trained`, the reranker's `reranker` or the teacher's `scorer`, under select/)
    is the fit part of the held-out split."""
    folder = (
        wildcards.get("trained") or wildcards.get("reranker") or wildcards.get("scorer")
    )
    return "fit" if SELECTION.on_fit(folder) else COLLECTIONS.train_split(wildcards)
