"""Command line: ``python -m tricks_lib run`` (the main job) and ``python -m tricks_lib describe``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tricks_lib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="execute the notebooks headless and summarize every measurement",
        description="Execute the notebooks headless in this interpreter, one fresh kernel each, and write the "
        "executed notebooks and a summary (summary.md, summary.json, and summary.html with the speedup plots) "
        "into --out. A run of some notebooks (--only) merges into the folder's earlier summary when both ran in "
        "the same mode on the same machine, else replaces it; it says which. --refresh also stores the outputs "
        "back into the notebooks. The notebooks: --notebooks DIR, else the checkout's notebooks/ (a clone or an "
        "editable install), else the copies shipped with the installed package.",
    )
    run.add_argument("--quick", action="store_true", help="small sizes: the whole suite in minutes (TRICKS_QUICK=1)")
    run.add_argument("--only", nargs="+", metavar="NN", help="run only these notebooks (number or name prefix)")
    run.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/)")
    run.add_argument("--refresh", action="store_true", help="also store the outputs back into the notebooks")
    run.add_argument(
        "--notebooks",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder of notebooks (default: the checkout's notebooks/, else the installed package's copies)",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="list the notebooks this would run (where they were found, each one's last recorded time), run none",
    )
    run.add_argument("--timeout", type=int, default=1800, help="seconds one cell may run (default 1800)")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    sub.add_parser("describe", help="print what this machine is, as the notebooks' first cell shows it")
    diff = sub.add_parser(
        "diff",
        help="list the tricks whose verdict differs between two runs",
        description="Compare two runs' summaries (folders or summary.json files), e.g. a CPU and a GPU run, "
        "or yesterday's and today's: list every trick whose verdict changed direction or significance.",
    )
    diff.add_argument("first", type=Path)
    diff.add_argument("second", type=Path)
    diff.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "describe":
        from tricks_lib.env import describe

        info = describe()
        print(info.summary())
        for key, value in info.to_dict().items():
            shown = ", ".join(map(str, value)) if isinstance(value, (tuple, list)) else "-" if value is None else value
            print(f"  {key}: {shown}")
        return 0

    if args.command == "diff":
        import json

        from tricks_lib.report.summary_diff import compare_summaries, diff_markdown, load_summary

        try:
            report = compare_summaries(load_summary(args.first), load_summary(args.second))
        except (OSError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(json.dumps(report, indent=2) if args.json else diff_markdown(report), end="" if not args.json else "\n")
        return 0

    from tricks_lib.env import quick_mode

    try:
        from tricks_lib.report.notebook_source import find_notebooks, last_run_seconds, locate_notebooks
        from tricks_lib.report.runner import earlier_results, run_notebooks, write_summary
    except ImportError as err:  # the core install has no Jupyter stack (so Colab's kernel stays as it is)
        print(
            f"error: the main command needs Jupyter's runner ({err.name} is missing): pip install 'tricks_lib[run]'",
            file=sys.stderr,
        )
        return 2

    if args.timeout <= 0:
        print("error: --timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"error: --out {args.out} is a file; pass a folder (it is created if missing)", file=sys.stderr)
        return 2
    try:
        quick = args.quick or quick_mode()
    except ValueError as err:  # a bad TRICKS_QUICK: one line, not a traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        source = locate_notebooks(args.notebooks)
        paths = find_notebooks(source.folder, args.only)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    mode = "quick" if quick else "full"
    if args.dry_run:
        print(f"Notebooks: {source}")
        print(f"Would run {len(paths)} notebook(s) in {mode} mode -> {args.out}/")
        width = max(len(p.stem) for p in paths)
        for path in paths:
            seconds = last_run_seconds(path, quick=quick, ledger_dir=args.out if source.shipped else None)
            last = f"last {mode} run {seconds:.0f} s" if seconds is not None else f"no {mode} run recorded"
            print(f"  {path.stem:<{width}}  {last}")
        return 0
    if args.refresh and source.shipped:
        print(
            f"error: --refresh stores outputs back into a checkout's notebooks/; {source.folder} is the installed "
            "package's copy. Run it in a clone of the repository, or drop --refresh",
            file=sys.stderr,
        )
        return 2
    earlier = earlier_results(args.out, quick=quick)
    print(f"Running {len(paths)} notebook(s) from {source} in {mode} mode -> {args.out}/", file=sys.stderr)
    runs = run_notebooks(
        paths, args.out, quick=quick, refresh=args.refresh, timeout=args.timeout, progress=not args.no_progress
    )
    md_path, json_path = write_summary(args.out, runs, quick=quick)
    carried = [r.name for r in runs if r.carried_over]
    if carried:
        print(f"Summary merged: {', '.join(carried)} kept from the earlier run in {args.out}/", file=sys.stderr)
    elif earlier is not None and not earlier.compatible:
        print(f"Summary replaced: the earlier run in {args.out}/ {earlier.reason}", file=sys.stderr)
    from tricks_lib.report.summary_html import SUMMARY_HTML_NAME

    print(f"Summary: {md_path}, {json_path} and {md_path.with_name(SUMMARY_HTML_NAME)}", file=sys.stderr)
    failures = [r for r in runs if not r.ok]
    for run in failures:
        print(f"FAILED: {run.describe_failure()}", file=sys.stderr)
    if any(r.interrupted for r in runs):
        return 130  # the shell's code for a run stopped by Ctrl-C (128 + SIGINT)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
