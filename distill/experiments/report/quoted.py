"""The verdict tables the docs quote, kept generated: in a Markdown file, a block

    <!-- verdicts: CLAIMS [beside EARLIER] -->
    ...
    <!-- end verdicts -->

holds exactly what `distill report --claims CLAIMS [--beside EARLIER]` prints (paths relative to
the repository root). After an archive lands, `python -m distill.experiments.report.quoted FILE...`
(`make outcome`) rewrites the blocks; `--check` rewrites nothing and exits 1 naming each stale
block (a docs test checks docs/study.md the same way), so a quoted table is never retyped or left
behind its archives. A head this format does not match, or one without its end, is an error.

Holm's family is a whole claims file, so an archive that lands also moves the adjusted intervals in
the reports of the archives already there: `--archives experiments/results` regenerates their
verdicts too (`distill.experiments.report.verdict_table.refreshed`), and `--check` names the stale ones."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

from distill.experiments.report import verdict_table
from distill.experiments.run.claims import ClaimsError

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(
    r"(?P<head><!-- verdicts: (?P<claims>\S+)(?: beside (?P<earlier>\S+))? -->)\n"
    r"(?P<body>(?:(?!<!-- verdicts:).)*?)\n?<!-- end verdicts -->",
    re.S,
)


def generated(claims: str, earlier: str | None, root: Path = ROOT) -> str:
    """What `distill report --claims CLAIMS [--beside EARLIER]` prints, run from `root`."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        verdict_table.claims_only(root / claims, None, root / earlier if earlier else None)
    return printed.getvalue().rstrip("\n").replace(f"{root}/", "")


def refresh(text: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """`text` with every verdict block regenerated, and the heads of the blocks that changed."""
    stale: list[str] = []

    def regenerate(block: re.Match) -> str:
        body = generated(block["claims"], block["earlier"], root)
        if body != block["body"]:
            stale.append(block["head"])
        return f"{block['head']}\n{body}\n<!-- end verdicts -->"

    return BLOCK.sub(regenerate, text), stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distill.experiments.report.quoted", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files holding verdict blocks")
    parser.add_argument(
        "--check",
        action="store_true",
        help="rewrite nothing; exit 1 if a block or an archive's verdicts are stale",
    )
    parser.add_argument(
        "--archives",
        type=Path,
        metavar="DIR",
        help="also regenerate the verdicts of every reported archive in DIR that names a claims file "
        "(report/verdicts.md, verdicts.json and report.md's verdict section)",
    )
    args = parser.parse_args(argv)
    if not args.files and args.archives is None:
        parser.error("give Markdown FILES, --archives DIR, or both")
    if args.archives is not None and not args.archives.is_dir():
        parser.error(
            f"--archives: {args.archives} is not a directory (the committed archives: experiments/results)"
        )
    stale_anywhere = False
    for sweep_dir in sorted(p for p in (args.archives.iterdir() if args.archives else ()) if p.is_dir()):
        try:
            stale = verdict_table.refreshed(sweep_dir)
        except ClaimsError as err:
            print(f"{sweep_dir}: {err}", file=sys.stderr)
            return 2
        for path, text in stale.items():
            print(f"{path}: {'stale' if args.check else 'regenerated'}")
            if not args.check:
                verdict_table.put(path, text)
            stale_anywhere = True
    for path in args.files:
        text = path.read_text()
        blocks = len(BLOCK.findall(text))
        if not blocks or blocks != text.count("<!-- verdicts:"):
            print(
                f"{path}: {text.count('<!-- verdicts:')} verdict heads, {blocks} well-formed blocks "
                "(`<!-- verdicts: CLAIMS [beside EARLIER] -->` ... `<!-- end verdicts -->`)",
                file=sys.stderr,
            )
            return 2
        new, stale = refresh(text, ROOT)
        for head in stale:
            print(f"{path}: {head} is {'stale' if args.check else 'regenerated'}")
        if stale and not args.check:
            path.write_text(new)
        stale_anywhere |= bool(stale)
    if args.check and stale_anywhere:
        print(
            "regenerate with `make outcome` (python -m distill.experiments.report.quoted [--archives DIR] FILE...)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
