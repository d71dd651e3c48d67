"""The `distill` command.

`distill fit|validate|test ...` go to LightningCLI; `distill sweep`, `distill report` and
`distill tiny-world` are plain subcommands, each implemented by its own module's `main(argv)`.
"""

from __future__ import annotations

import importlib
import os
import sys

SUBCOMMANDS = {
    "tiny-world": "distill.models.tiny_world",
    "sweep": "distill.experiments.run.sweep",
    "report": "distill.experiments.report.report",
}
LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test")
USAGE = (
    "usage: distill {fit,validate,test,sweep,report,tiny-world} ...\n"
    "  fit/validate/test  LightningCLI (distill fit --help)\n"
    "  sweep SPEC         run a grid of fits (distill sweep --help)\n"
    "  report DIR         tables, plots and factor analysis of a sweep\n"
    "  tiny-world         install or build the CPU tiny world (teacher, student, teacher-es, teacher-sci, student-sci; --version v3, v2, v1)\n"
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    command, rest = argv[0], argv[1:]
    if command in SUBCOMMANDS:
        return int(importlib.import_module(SUBCOMMANDS[command]).main(rest) or 0)
    if command in LIGHTNING_SUBCOMMANDS:
        from distill.lightning_cli import run_lightning_cli

        run_lightning_cli(argv)
        return 0
    print(f"distill: unknown command {command!r}\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
