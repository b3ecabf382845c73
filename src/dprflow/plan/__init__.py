"""The workflow's plan as code (issue 53): what the rules, the comparison and the report share.

- :mod:`.methods`: one record per method (its paper, corpus stage, stage-one model, geometry,
  zeroshot row), from which the rules derive their method lists;
- :mod:`.rows`: a row of the comparison, its name's grammar (``bm25``, ``<method>/zeroshot``,
  ``<method>/seed-<seed>/<stage>``, ``<row>+bm25``, ``<row>/on-<collection>``): named, parsed and
  formatted here only.
"""
