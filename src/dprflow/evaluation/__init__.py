"""Evaluation and reporting.

- :mod:`.metrics`: ir_measures over a passage run mapped to documents (MaxP);
- :mod:`.compare`: the comparison table, seeds, paired t-tests with Holm's correction, and the
  papers' published figures (``paper_numbers.csv``);
- :mod:`.report`, :mod:`.plots`: the HTML comparison with provenance and the report's figures.

Stages ``evaluate``, ``compare``, ``report_results``, ``check``.
"""
