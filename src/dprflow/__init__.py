"""dprflow: dense passage retrieval pre-training and fine-tuning, reproduced as a Snakemake workflow.

Library code lives in this package and never parses arguments; each workflow rule runs one
``python -m dprflow.stages.<rule>`` module, a thin command-line layer over the library.

- ``pretraining/``: one folder per paper family (``condenser``, ``contriever``, ``mae``,
  ``query_as_context``), each with its model, its loss and the batches it feeds the loss;
- ``finetuning/``: the retriever and reranker every paper fine-tunes (bi-encoder, cross-encoder,
  losses, training examples, reranking);
- ``models/``: what both stand on: the model folder format, loading the initial model, pooling,
  the text a passage is encoded as;
- ``training/``: the trainer, the gradient cache, distributed helpers and how each loss is stepped;
- ``search/``: Lucene BM25, dense encoding and faiss search, runs;
- ``evaluation/``: ir_measures metrics, the comparison table, the report and its figures;
- ``data/``: the Parquet schemas, passages, test collections;
- ``cli``, ``errors``, ``files``, ``config``, ``provenance``: stage plumbing shared by every stage;
  ``hardware``, ``precision``: the device's properties and the precision resolved for it.
"""

__version__ = "0.1.0"
