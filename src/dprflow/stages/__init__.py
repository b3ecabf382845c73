"""One command-line module per workflow rule: ``python -m dprflow.stages.<rule> --help``.

Each module is a thin layer: a dataclass of arguments, ``main(argv) -> int``, and calls into the
library. The rule of the same name in ``rules/`` runs it.
"""
