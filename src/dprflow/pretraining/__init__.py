"""Pre-training methods, one folder per paper family, and what they share.

- :mod:`.mlm`: BERT's masked language model from random weights (Devlin et al., 2019), the MLM
  base that ``model.init: mlm`` starts every method from;
- :mod:`.condenser`: Condenser (Gao & Callan, 2021) and coCondenser (Gao & Callan, 2022);
- :mod:`.contriever`: Contriever (Izacard et al., 2022), random crops with a MoCo queue or
  in-batch negatives;
- :mod:`.mae`: bottlenecked masked auto-encoders: BMAE, CDMAE (the challenging decoder) and
  CoT-MAE, with the n-gram PMI statistics and importance masking CDMAE needs;
- :mod:`.query_as_context`: doc2query generation and the (passage, query) pairs of
  query-as-context pre-training;
- :mod:`.documents`: the generic corpus and the collection's documents as token sequences;
- :mod:`.masking`: BERT masking shared by every MLM loss.

How a loss is stepped (gradient cache, gathering across processes) is not here: see
:mod:`dprflow.training`.
"""
