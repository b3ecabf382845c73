"""The shared command-line layer of the stage modules.

Each stage declares its arguments as a dataclass (field metadata ``help``), and calls
:func:`run_stage`, which parses ``argv`` into it, sets up logging once, logs the resolved
arguments first, runs the stage and turns expected failures into a one-line error and a non-zero
exit instead of a traceback. After a success it writes each output's provenance record
(:mod:`dprflow.provenance`), with the figures the stage measured of its output when it returns
any (a mapping of names to numbers, such as a held-out loss).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dprflow import provenance
from dprflow.errors import StageError
from dprflow.progress import quiet_hugging_face

log = logging.getLogger("dprflow")

A = TypeVar("A")


def _base_type(tp: Any) -> tuple[Any, bool]:
    """Return (type, is_list) of a dataclass field annotation such as ``int | None`` or ``list[str]``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    if origin in (list, tuple):
        return typing.get_args(tp)[0], True
    return tp, False


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def build_parser(cls: type, prog: str, description: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description or cls.__doc__)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, is_list = _base_type(hints[f.name])
        kw: dict[str, Any] = {"help": f.metadata.get("help", ""), "dest": f.name}
        if tp is bool:
            kw["type"] = _parse_bool
        elif tp in (int, float, str):
            kw["type"] = tp
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if is_list:
            kw["nargs"] = "*"
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kw["required"] = True
        else:
            kw["default"] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        parser.add_argument("--" + f.name.replace("_", "-"), **kw)
    return parser


def parse_args(cls: type[A], argv: Sequence[str] | None, prog: str) -> A:
    ns = build_parser(cls, prog).parse_args(argv)
    args = cls(**vars(ns))
    check = getattr(args, "check", None)
    if callable(check):
        try:
            check()
        except ValueError as exc:
            build_parser(cls, prog).error(str(exc))
    return args


def setup_logging(level: int = logging.INFO) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
        )
    root.setLevel(level)


def run_stage(
    cls: type[A], body: Callable[[A], dict[str, Any] | None], argv: Sequence[str] | None, prog: str
) -> int:
    """Parse, log the resolved arguments, run ``body``; return the process exit code. What
    ``body`` returns (None, or figures it measured) goes into the provenance records."""
    setup_logging()
    quiet_hugging_face()
    args = parse_args(cls, argv, prog)
    log.info("%s arguments: %s", prog, json.dumps(dataclasses.asdict(args), default=str, sort_keys=True))
    try:
        started = provenance.start(args)
        figures = body(args)
    except (StageError, ValueError, FileNotFoundError, UnicodeDecodeError) as exc:
        log.error("%s failed: %s", prog, exc)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a library's own error (Java's, faiss's, torch's, an OS error)
        log.exception("%s failed", prog)  # the traceback, in the job's log, for a bug report
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if distributed_rank() == 0:
        provenance.write(prog, args, started, figures)
    return 0


def distributed_rank() -> int:
    """This process's rank under torchrun (0 alone): only rank 0 writes records."""
    return int(os.environ.get("RANK", "0") or 0)
