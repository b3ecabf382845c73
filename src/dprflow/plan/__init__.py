"""The workflow's plan as code (issue 53): what the rules, the comparison and the report share.

- :mod:`.methods`: one record per method (its paper, corpus stage, stage-one model, geometry,
  zeroshot row), from which the rules derive their method lists;
- :mod:`.rows`: a row of the comparison, its name's grammar (``bm25``, ``<method>/zeroshot``,
  ``<method>/seed-<seed>/<stage>``, ``<row>+bm25``, ``<row>/on-<collection>``): named, parsed and
  formatted here only;
- :mod:`.run_rows`: the rows a config's run scores (collections, seeds, stages, fused, transfer);
- :mod:`.models`: the models jobs start from (model.init or the MLM base, the stage-one
  Condenser, each method's encoder, the reranker's start), their geometry, inputs, fingerprints;
- :mod:`.collections`: each collection's settings and splits, where a row is scored, ingest;
- :mod:`.pretrain`, :mod:`.doc2query`, :mod:`.selection`, :mod:`.finetune`: each family's inputs
  and flags;
- :mod:`.report`: what the comparison and the report read (metrics, encoders, trained models'
  folders, the recorded config);
- :mod:`.resources`: what a job asks a cluster for, and how a training job starts.

The rules build one object of each from the config (rules/common.smk) and name its methods as
input, params and resources functions.
"""

from typing import Any


class UnderResults:
    """A part of the plan whose files lie under the results folder, ``self.results``."""

    results: str

    def path(self, *parts: Any) -> str:
        """``<results>/<part>/...``: wildcard values or ``{wildcard}`` patterns among the parts."""
        return "/".join([self.results, *map(str, parts)])
