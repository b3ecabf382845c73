def embeddings_output():
    """A shard of corpus embeddings: removed once every job that reads it is done, unless
    finetune.keep_embeddings (a BERT-base row of MS MARCO holds about 27 GB)."""
    path = FINETUNE.embeddings_pattern()
    return path if FT["keep_embeddings"] else temp(path)
