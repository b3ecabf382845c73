"""One command-line module per workflow rule: ``python -m dprflow.stages.<rule> --help``.

Each module is a thin layer: a dataclass of arguments, ``main(argv) -> int``, and calls into the
library. The rule of the same name in ``rules/`` runs it.

Importing this package checks the address-space limit (``ulimit -v``) before a stage imports
torch: under a low one torch dies in C++ (``std::bad_alloc``, ``failed to map segment``) with
nothing saying why, so the reason is written first.
"""

from __future__ import annotations

import resource
import sys

# torch and transformers map 3.7 GB of virtual memory when imported (their libraries, measured
# with torch 2.14 and transformers 5.24), each thread more: a torch stage needs this much.
TORCH_ADDRESS_SPACE = 8 * 2**30


def address_space_warning(limit: int) -> str | None:
    """What a stage should say before it starts under an address-space limit of ``limit`` bytes
    (``resource.RLIM_INFINITY``: none), or None when torch fits."""
    if limit == resource.RLIM_INFINITY or limit >= TORCH_ADDRESS_SPACE:
        return None
    return (
        f"dprflow: the address-space limit (ulimit -v) is {limit // 2**20} MB: torch maps about 3.7 GB "
        "of virtual memory when imported and more per thread, so a stage that uses torch dies under "
        "this limit with 'std::bad_alloc', 'failed to map segment' or 'cannot allocate memory for "
        f"thread-local data'. Raise it to {TORCH_ADDRESS_SPACE // 2**30} GB or more (ulimit -v "
        "unlimited), and bound resident memory instead (Slurm --mem, resources.mem_mb)."
    )


_warning = address_space_warning(resource.getrlimit(resource.RLIMIT_AS)[0])
if _warning:
    print(_warning, file=sys.stderr, flush=True)
