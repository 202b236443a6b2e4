"""Structure measures of the notebooks' code cells (issue 10's closing-note numbers).

    python benchmarks/notebook_measures.py [notebooks/]

Prints JSON: per notebook, code lines, lines that are part of a string literal (prose built in
code), their share, and the functions and classes defined in cells; plus the names defined in more
than one notebook.
"""

from __future__ import annotations

import ast
import io
import json
import sys
import tokenize
from pathlib import Path


def _cell_code(source: str) -> str:
    # IPython magics (%pip, !cmd) are not Python: blank them out, keeping the line count.
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def measure_cell(source: str) -> tuple[int, int, list[str]]:
    """(non-blank code lines, of them prose lines built from string literals, names defined at top level)."""
    code = _cell_code(source)
    lines = {i + 1 for i, line in enumerate(code.splitlines()) if line.strip() and not line.strip().startswith("#")}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = []
    docstrings = set()
    try:
        tree = ast.parse(code)
        names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    docstrings.update(range(first.lineno, first.end_lineno + 1))
    except SyntaxError:
        names = []
    # Characters of each line that belong to string literals (f-strings included, their {fields} too).
    in_string: dict[int, int] = {}
    code_lines = code.splitlines()

    def mark(start: tuple[int, int], end: tuple[int, int]) -> None:
        for row in range(start[0], end[0] + 1):
            text = code_lines[row - 1]
            lo = start[1] if row == start[0] else 0
            hi = end[1] if row == end[0] else len(text)
            in_string[row] = in_string.get(row, 0) + len(text[lo:hi].strip())

    fstring_start = getattr(tokenize, "FSTRING_START", None)
    depth, start = 0, None
    for tok in tokens:
        if tok.type == tokenize.STRING:
            mark(tok.start, tok.end)
        elif fstring_start is not None and tok.type == fstring_start:
            depth += 1
            start = tok.start if depth == 1 else start
        elif fstring_start is not None and tok.type == tokenize.FSTRING_END:
            depth -= 1
            if depth == 0:
                mark(start, tok.end)
    # A prose line: string literals make up most of its characters (a sentence built in code, not a
    # label or a dict key). Docstrings are documentation, not prose.
    prose = {
        n for n in lines if n not in docstrings and in_string.get(n, 0) > 0.5 * len("".join(code_lines[n - 1].split()))
    }
    return len(lines), len(prose), names


def measure_notebooks(folder: Path) -> dict:
    per_notebook, defined = {}, {}
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        total = prose = 0
        names = []
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            n, p, defs = measure_cell("".join(cell["source"]))
            total, prose, names = total + n, prose + p, names + defs
        per_notebook[path.stem] = {
            "code_lines": total,
            "string_literal_lines": prose,
            "string_literal_share": round(prose / total, 3) if total else 0.0,
            "defined_in_cells": len(names),
        }
        for name in names:
            defined.setdefault(name, set()).add(path.stem)
    total = sum(v["code_lines"] for v in per_notebook.values())
    prose = sum(v["string_literal_lines"] for v in per_notebook.values())
    return {
        "notebooks": per_notebook,
        "string_literal_share": round(prose / total, 3) if total else 0.0,
        "defined_in_more_than_one_notebook": {k: sorted(v) for k, v in sorted(defined.items()) if len(v) > 1},
    }


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "notebooks"
    print(json.dumps(measure_notebooks(folder), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
