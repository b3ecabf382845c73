"""Retrieval: Lucene BM25, dense encoding and exact faiss search, and runs.

- :mod:`.bm25`: Anserini's indexer and searcher (pyserini's jar) with BM25 parameters;
- :mod:`.dense`: encoding texts with a bi-encoder, embedding shards, the faiss flat index, and
  nb-recall (coCondenser Figure 3);
- :mod:`.runs`: writing runs (Parquet and TREC), positives, and negatives from a run;
- :mod:`.fusion`: a dense run fused with BM25's (pyserini's fusion functions).

Stages ``bm25_index``, ``bm25_search``, ``bm25_negatives``, ``encode_corpus``, ``search_dense``,
``mine_negatives``, ``nb_recall``, ``select_fusion``, ``fuse``.
"""
