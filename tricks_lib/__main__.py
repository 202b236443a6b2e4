"""Command line: ``python -m tricks_lib run`` (the main job), ``describe``, ``diff`` and ``advise``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the run extra's: imported when the command runs (a core install lacks them)
    from tricks_lib.report.notebook_source import NotebookSource
    from tricks_lib.report.runner import NotebookRun, RunPlan


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
    run.add_argument(
        "--only",
        nargs="+",
        metavar="NN",
        help="run only these notebooks (a number, e.g. 3 or 03, or a unique name prefix)",
    )
    run.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/)")
    run.add_argument(
        "--refresh",
        action="store_true",
        help="also store the outputs back into the notebooks, and the run times in notebooks/run_times.json",
    )
    run.add_argument(
        "--record-times",
        action="store_true",
        help="record the run times in notebooks/run_times.json (without it, a run writes them into --out only)",
    )
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
    advise = sub.add_parser(
        "advise",
        help="try every applicable trick on your own model: checked, then measured",
        description="Try every applicable training (or, with --inference, inference) trick on the model a module of "
        "yours defines: each trick is checked against the baseline step (same loss, gradients and update, or "
        "outputs, within a tolerance; a lossy trick's error is reported), then timed in one interleaved "
        "comparison. Prints the table and the lines to add. MODULE is an importable name or a .py file defining "
        "make_model, make_batch and loss_fn (optionally make_optimizer); with --inference, make_model and "
        "make_input.",
    )
    advise.add_argument("module", help="module name or path to a .py file")
    advise.add_argument("--inference", action="store_true", help="the forward pass (make_model, make_input)")
    advise.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: CUDA when present)")
    advise.add_argument("--budget", type=float, default=120.0, help="seconds the whole report may take (default 120)")
    advise.add_argument("--tricks", nargs="+", default=None, metavar="NAME", help="only these tricks (default all)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "describe":
        return _describe()
    if args.command == "diff":
        return _diff(args)
    if args.command == "advise":
        return _advise(args)
    return _run(args)


def _advise(args: argparse.Namespace) -> int:
    from tricks_lib.advise.from_module import advise_module

    try:
        report = advise_module(
            args.module, inference=args.inference, device=args.device, budget_s=args.budget, tricks=args.tricks
        )
    except (TypeError, ValueError) as err:
        return _error(str(err))
    print(report)
    print("Lines to add:\n")
    print(report.code())
    return 0


def _error(message: str) -> int:
    """Say what is wrong in one line (no traceback); the exit code of a bad invocation."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def _describe() -> int:
    from tricks_lib.env import describe

    info = describe()
    print(info.summary())
    for key, value in info.to_dict().items():
        shown = ", ".join(map(str, value)) if isinstance(value, (tuple, list)) else "-" if value is None else value
        print(f"  {key}: {shown}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    import json

    from tricks_lib.report.summary_diff import compare_summaries, diff_markdown, load_summary

    try:
        report = compare_summaries(load_summary(args.first), load_summary(args.second))
    except (OSError, ValueError) as err:
        return _error(str(err))
    except (KeyError, TypeError) as err:  # a row that passed the check but lacks what the comparison reads
        return _error(f"{args.first} or {args.second} holds a malformed summary row ({type(err).__name__}: {err})")
    print(json.dumps(report, indent=2) if args.json else diff_markdown(report), end="" if not args.json else "\n")
    return 0


def _run(args: argparse.Namespace) -> int:
    """``run``: check the arguments, list the notebooks (``--dry-run``) or run them; the exit code."""
    from tricks_lib.env import quick_mode

    try:
        from tricks_lib.report.notebook_source import find_notebooks, locate_notebooks
        from tricks_lib.report.runner import plan_run, run_plan, write_summary
    except ImportError as err:  # the core install has no Jupyter stack (so Colab's kernel stays as it is)
        return _error(f"the main command needs Jupyter's runner ({err.name} is missing): pip install 'tricks_lib[run]'")
    if args.timeout <= 0:
        return _error("--timeout must be a positive number of seconds")
    if args.out.exists() and not args.out.is_dir():
        return _error(f"--out {args.out} is a file; pass a folder (it is created if missing)")
    try:
        quick = args.quick or quick_mode()  # a bad TRICKS_QUICK: one line, not a traceback
        source = locate_notebooks(args.notebooks)
        paths = find_notebooks(source.folder, args.only)
    except ValueError as err:
        return _error(str(err))
    if args.dry_run:
        return _dry_run(source, paths, args.out, quick=quick)
    if (args.refresh or args.record_times) and source.shipped:
        flag = "--refresh" if args.refresh else "--record-times"
        return _error(
            f"{flag} writes into a checkout's notebooks/; {source.folder} is the installed "
            f"package's copy. Run it in a clone of the repository, or drop {flag}"
        )
    try:
        plan = plan_run(
            paths,
            args.out,
            quick=quick,
            refresh=args.refresh,
            record_times=args.record_times,
            timeout=args.timeout,
            progress=not args.no_progress,
            source=source,
        )
    except ValueError as err:  # --refresh of the shipped copies named by --notebooks
        return _error(str(err))
    print(f"Running {len(paths)} notebook(s) from {source} in {plan.mode} mode -> {args.out}/", file=sys.stderr)
    runs = run_plan(plan)
    try:
        md_path, json_path = write_summary(args.out, runs, quick=quick)
    except OSError as err:  # a full disk: say what ran, in the terminal, since the summary cannot be written
        for run in runs:
            print(f"{'ok' if run.ok else 'FAILED'}: {run.name}" + ("" if run.ok else f": {run.error}"), file=sys.stderr)
        return _error(f"could not write the summary into {args.out}/ ({err}); the notebooks' outcomes are above")
    return _report(plan, runs, md_path, json_path)


def _dry_run(source: NotebookSource, paths: list[Path], out: Path, *, quick: bool) -> int:
    from tricks_lib.report.notebook_source import last_run_seconds

    mode = "quick" if quick else "full"
    print(f"Notebooks: {source}")
    print(f"Would run {len(paths)} notebook(s) in {mode} mode -> {out}/")
    width = max(len(p.stem) for p in paths)
    known = []
    for path in paths:
        seconds = last_run_seconds(path, quick=quick, ledger_dir=out)
        last = f"last {mode} run {seconds:.0f} s" if seconds is not None else f"no {mode} run recorded"
        print(f"  {path.stem:<{width}}  {last}")
        if seconds is not None:
            known.append(seconds)
    unknown = len(paths) - len(known)
    total = f"Expected: {sum(known) / 60:.1f} min in all" if known else "Expected: unknown (no run recorded)"
    print(total + (f", plus {unknown} notebook(s) with no {mode} run recorded" if known and unknown else ""))
    return 0


def _report(plan: RunPlan, runs: list[NotebookRun], md_path: Path, json_path: Path) -> int:
    """Say how the summary joined the folder's earlier one, where it is, and what failed; the exit code."""
    from tricks_lib.report.summary_html import SUMMARY_HTML_NAME

    carried = [r.name for r in runs if r.carried_over]
    if carried:
        print(f"Summary merged: {', '.join(carried)} kept from the earlier run in {plan.out_dir}/", file=sys.stderr)
    elif plan.replace_reason is not None:
        print(f"Summary replaced: the earlier run in {plan.out_dir}/ {plan.replace_reason}", file=sys.stderr)
    print(f"Summary: {md_path}, {json_path} and {md_path.with_name(SUMMARY_HTML_NAME)}", file=sys.stderr)
    failures = [r for r in runs if not r.ok]
    for run in failures:
        print(f"FAILED: {run.describe_failure()}", file=sys.stderr)
    problems = json.loads(json_path.read_text(encoding="utf-8")).get("problems", [])
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    if any(r.interrupted for r in runs):
        return 130  # the shell's code for a run stopped by Ctrl-C (128 + SIGINT)
    return 1 if failures or problems else 0


if __name__ == "__main__":
    sys.exit(main())
