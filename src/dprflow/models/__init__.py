"""What a model is outside any one method: its folder, how it is loaded, how it embeds a text.

- :mod:`.init`: ``model.init`` resolved to what Hugging Face loads (a packaged model, a folder or
  a hub id), and its tokenizer;
- :mod:`.st_format`: the sentence-transformers folder format read and written, model cards;
- :mod:`.pooling`: token vectors pooled into a text's embedding (CLS or mean);
- :mod:`.texts`: the text an encoder reads for a passage (``title [SEP] text``);
- :mod:`.packed`: padding-free training steps (a batch's real tokens packed into one sequence).

Pre-training and fine-tuning both stand on this package; it imports neither.
"""
