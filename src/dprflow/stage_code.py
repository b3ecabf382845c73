"""The source files a stage runs: its module and every ``dprflow`` module it imports.

Each rule takes these files as inputs, so that editing any module a stage imports (a loss, a
batch builder, the trainer) reruns the stage, not only an edit of the stage's own file. The
closure is read from the import statements of the source files (nothing is imported):
``import dprflow.a.b``, ``from dprflow.a import b`` (a module, or a name of ``dprflow.a``) and
relative imports, wherever they stand in a file (imports deferred into functions count), with
the ``__init__.py`` of every package on the way. A module reached only through ``importlib`` with a
computed name is not seen; dprflow has none.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

PACKAGE = "dprflow"


def stage_sources(stage: str, src: str | Path) -> list[str]:
    """The files of ``dprflow.stages.<stage>`` and of every ``dprflow`` module it imports, directly
    or through others, under the source root ``src`` (the folder holding ``dprflow/``), sorted."""
    return sorted(str(path) for path in _closure(f"{PACKAGE}.stages.{stage}", str(Path(src).resolve())))


@functools.cache
def _closure(module: str, src: str) -> frozenset[Path]:
    """The files of ``module`` and of what it imports, transitively (memoised per process: a DAG
    build asks for every rule's stage)."""
    seen: set[str] = set()
    files: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(name, src)
        if path is None:
            continue
        files.add(path)
        todo.extend(_packages_of(name))
        todo.extend(imported_modules(path, name, src))
    return frozenset(files)


@functools.cache
def module_file(name: str, src: str) -> Path | None:
    """The file of module ``name`` (``a/b.py`` or ``a/b/__init__.py`` under ``src``), or None."""
    base = Path(src, *name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _packages_of(name: str) -> list[str]:
    """The packages importing ``name`` runs first: ``dprflow``, ``dprflow.a`` for ``dprflow.a.b``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


# `import a.b[ as c][, d]` and `from [.]a.b import x[ as y], ...` (parenthesised over several
# lines too), anywhere in a line's indentation: a scan of the text, about 30 times faster than
# parsing it (a DAG build reads every module the stages import). A statement quoted inside a
# string would add a file, never drop one.
_IMPORT = re.compile(
    r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*)", re.M
)
_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M)


@functools.cache
def imported_modules(path: Path, name: str, src: str) -> tuple[str, ...]:
    """The ``dprflow`` modules the file ``path`` of module ``name`` imports (any nesting)."""
    text = path.read_text()
    is_package = path.name == "__init__.py"
    found = [part.split()[0] for match in _IMPORT.finditer(text) for part in match.group(1).split(",")]
    for dots, module, names in _FROM.findall(text):
        base = _absolute(module or None, len(dots), name, is_package)
        found.append(base)
        # `from pkg import x`: x is a submodule when it has a file, else a name of pkg
        for alias in names.strip("()").replace("\\", " ").split(","):
            word = alias.split()[0] if alias.split() else ""
            if word.isidentifier() and module_file(f"{base}.{word}", src) is not None:
                found.append(f"{base}.{word}")
    return tuple(m for m in found if m == PACKAGE or m.startswith(PACKAGE + "."))


def _absolute(module: str | None, level: int, name: str, is_package: bool) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in module ``name``."""
    if level == 0:
        return module or ""
    parts = name.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join(anchor + ([module] if module else []))
