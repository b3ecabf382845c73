"""Every shipped config's planned shell commands, sorted, one file per config: the check that a
refactor of the rules changed no job (issue 53: "the same shell commands, sorted, line for line").

    python scripts/planned_commands.py OUTDIR            # before the change
    python scripts/planned_commands.py OUTDIR2           # after it
    diff -r OUTDIR OUTDIR2                               # nothing: no job changed

Each config (config/config.yaml, config/examples/*.yaml, config/presets/*.yaml) is planned with
``snakemake -n -p --forceall --nolock`` in the checkout (every job is planned whatever exists;
nothing is written but Snakemake's own metadata), and its ``Shell command:`` lines are written
sorted to ``OUTDIR/<config>.txt``. Configs that name local collections (the examples read
``../shared/collections``) need them where they say.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shipped_configs() -> list[Path]:
    config = ROOT / "config"
    return [
        config / "config.yaml",
        *sorted((config / "examples").glob("*.yaml")),
        *sorted((config / "presets").glob("*.yaml")),
    ]


def planned(config: Path) -> list[str]:
    """The sorted shell commands of a dry run of ``config`` from an empty folder."""
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    cmd = [snakemake, "-n", "-p", "--forceall", "--nolock", "--cores", "2", "-s", str(ROOT / "Snakefile")]
    cmd += ["-d", str(ROOT), "--configfile", str(config)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{config}: snakemake -n failed:\n{(result.stdout + result.stderr)[-1500:]}")
    return sorted(
        line.removeprefix("Shell command: ")
        for line in result.stdout.splitlines()
        if line.startswith("Shell command: ")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--config", type=Path, nargs="*", help="these configs only (default: every shipped one)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for config in args.config or shipped_configs():
        try:
            lines = planned(config.resolve())
        except RuntimeError as error:
            print(error, file=sys.stderr)
            failed.append(config)
            continue
        path = config.resolve()
        name = path.relative_to(ROOT / "config") if path.is_relative_to(ROOT / "config") else Path(path.name)
        target = args.out / str(name.with_suffix(".txt")).replace("/", "__")
        target.write_text("\n".join(lines) + "\n")
        print(f"{config}: {len(lines)} commands -> {target}")
    if failed:
        print(f"not planned: {', '.join(map(str, failed))}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
