"""The workflow's plan as code (issue 53): what the rules, the comparison and the report share.

- :mod:`.rows`: a row of the comparison, its name's grammar (``bm25``, ``<method>/zeroshot``,
  ``<method>/seed-<seed>/<stage>``, ``<row>+bm25``, ``<row>/on-<collection>``): named, parsed and
  formatted here only.
"""
