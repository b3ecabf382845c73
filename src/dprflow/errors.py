"""The error every stage reports as one line: :class:`StageError`.

Library modules raise it for bad input or bad arguments; :func:`dprflow.cli.run_stage` prints its
message without a traceback and exits non-zero. It lives apart from the command-line layer so
that the library raises it without importing that layer.
"""

from __future__ import annotations


class StageError(Exception):
    """An expected failure of a stage: bad input or bad arguments. Printed without a traceback."""
