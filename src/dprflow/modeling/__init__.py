"""Fine-tuning models: the bi-encoder retriever (:mod:`.biencoder`) and the cross-encoder reranker (:mod:`.cross_encoder`).

Both wrap a Hugging Face ``AutoModel`` backbone (the pre-trained encoder, its pre-training head
discarded, coCondenser §3.4) and save as ``save_pretrained`` folders that ``AutoModel`` loads.
"""
