"""Data that crosses stage boundaries.

- :mod:`.schemas`: every Parquet table (documents, queries, qrels, passages, runs, negatives,
  embeddings, metrics), read and written with a schema check and atomic renames;
- :mod:`.passages`: documents cut into passages of whole sentences;
- :mod:`.collections`: test collections (the embedded ``stdlib`` one, BEIR folders, ir_datasets).

Stages ``ingest`` and ``split_passages``.
"""
