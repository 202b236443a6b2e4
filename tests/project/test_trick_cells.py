"""The trick is the cell: each trick's own PyTorch lines are in its section's code, and each notebook is short.

Read from the stored notebooks (a full-mode run of the main command):
- every trick section's code cells contain that trick's own calls (``TRICK_CALLS``), read from the code's syntax
  tree, so comments and strings do not count (a ``%%writefile`` cell counts: it is the script a reader runs);
- the notebooks import few library names (a median of at most 12, none over 24);
- the main command's recorded run times meet the reader's budget (``notebooks/run_times.json``);
- each notebook ends with its what-to-copy cell, and every line it lists ran in a code cell of the notebook.
"""

import ast
import json
import os
import re
import statistics
from pathlib import Path

import pytest

from tricks_lib.report.run_times import LEDGER_NAME

ROOT = Path(__file__).resolve().parents[2]
# TRICKS_CHECK_NOTEBOOKS=DIR checks the executed copies a run wrote there instead (e.g. a quick run's --out).
NOTEBOOKS = sorted(Path(os.environ.get("TRICKS_CHECK_NOTEBOOKS", ROOT / "notebooks")).glob("[0-9][0-9]_*.ipynb"))

# notebook -> section heading (a part of its text) -> the calls, attributes or keywords its code must contain.
# "x.y" matches any name ending in it ("torch.x.y", "model.y" for "y"); "name=" is a keyword argument.
TRICK_CALLS = {
    "00_start_here": {
        "Timing GPU work without a sync": ["torch.cuda.synchronize"],
        "First-call and compile cost": ["torch.compile"],
        "allocated vs reserved": ["torch.cuda.max_memory_allocated", "torch.cuda.memory_reserved"],
    },
    "01_data_io": {
        "Faster decoding": ["draft", "cv2.imdecode"],
        "Prefetching": ["DataLoader", "num_workers=", "prefetch_factor=", "persistent_workers="],
        "pin_memory": ["DataLoader", "pin_memory=", "non_blocking="],
        "memory-mapped": ["mmap_mode="],
    },
    "02_training": {
        "Mixed precision": ["torch.autocast", "GradScaler", "scale", "step", "update"],
        "cudnn.benchmark": ["torch.backends.cudnn.benchmark"],
        "zero_grad(set_to_none=True)": ["zero_grad", "set_to_none=", "torch.no_grad", "torch.inference_mode"],
        "channels_last": ["to", "memory_format=", "torch.channels_last"],
        "Fusing pointwise": ["torch.compile", "torch.jit.script"],
        "Many small ops": ["torch._foreach_mul_", "torch.bmm"],
        "The optimizer step": ["foreach=", "fused="],
        "DistributedDataParallel": [
            "init_process_group",
            "DistributedDataParallel",
            "no_sync",
            "destroy_process_group",
        ],
        "All together": ["torch.autocast", "torch.channels_last", "torch.compile", "zero_grad"],
    },
    "03_memory": {
        "In-place": ["inplace"],
        "Mixed precision": ["torch.autocast"],
        "`no_grad` and `inference_mode`": ["torch.no_grad", "torch.inference_mode"],
        "Freezing": ["requires_grad"],
        "empty_cache": ["torch.cuda.empty_cache", "torch.cuda.memory_reserved"],
        "Gradient accumulation": ["backward", "step", "zero_grad"],
        "Gradient checkpointing": ["checkpoint", "use_reentrant="],
    },
    "04_model_design": {
        "G1:": ["nn.Conv2d"],
        "G2:": ["nn.Conv2d", "groups="],
        "G3:": ["nn.Conv2d"],
        "G4:": ["relu"],
        "Pruning": ["prune.l1_unstructured", "prune.remove"],
        "Distillation": ["kl_div", "log_softmax"],
    },
    "05_inference": {
        "Lower precision": ["torch.autocast"],
        "INT8 quantization": ["quantize_dynamic"],
        "Conv + BatchNorm fusion": ["fuse_modules"],
        "RepVGG": ["pad"],
        "Compilers and runtimes": ["torch.compile", "torch.onnx.export", "InferenceSession"],
    },
    "06_time_analysis": {
        "Python profilers": ["cProfile.Profile", "pstats.Stats"],
        "`torch.profiler`": ["profile", "record_function", "schedule", "key_averages", "export_chrome_trace"],
        "Host-device syncs": ["torch.cuda.set_sync_debug_mode", "torch.autograd.detect_anomaly"],
    },
    "07_reproducibility": {
        "Seeding": ["random.seed", "np.random.seed", "torch.manual_seed"],
        "Deterministic algorithms": [
            "torch.use_deterministic_algorithms",
            "torch.backends.cudnn.deterministic",
            "torch.backends.cudnn.benchmark",
        ],
        "worker-seeding": ["worker_init_fn=", "generator=", "torch.initial_seed"],
        "Resuming": ["torch.get_rng_state", "np.random.get_state", "random.getstate"],
    },
    "08_capstone": {
        "One training function": [
            "torch.autocast",
            "torch.channels_last",
            "torch.compile",
            "zero_grad",
            "set_to_none=",
            "label_smoothing=",
            "backward",
        ],
    },
    "09_your_model": {
        "The check inside the call, by hand": [
            "to",
            "memory_format=",
            "torch.channels_last",
            "torch.autocast",
            "backward",
        ],
    },
    "10_pytorch2": {
        "Compile modes": ["torch.compile", "mode=", "inductor_config.freezing"],
        "Shapes that change": ["torch.compile", "dynamic="],
        "Regional compilation": ["block.compile"],
        "Compile caches": ["torch.compiler.save_cache_artifacts", "torch.compiler.load_cache_artifacts"],
        "Graph breaks": ["torch._dynamo.explain", "fullgraph=", "torch.where"],
        "Attention kernels": ["F.scaled_dot_product_attention", "sdpa_kernel", "create_block_mask", "flex_attention"],
        "Export for deployment": [
            "torch.export.export",
            "torch._inductor.aoti_compile_and_package",
            "torch._inductor.aoti_load_package",
        ],
        "Sharding on one box": [
            "fully_shard",
            "DDP",
            "register_comm_hook",
            "init_process_group",
            "destroy_process_group",
        ],
        "Memory on CUDA": [
            "torch.autograd.graph.save_on_cpu",
            "torch.cuda.memory._record_memory_history",
            "torch.cuda.memory._dump_snapshot",
        ],
        "Newer loading": ["DataLoader", "in_order=", "StatefulDataLoader", "state_dict", "load_state_dict"],
        "GPU only": ["torch.cuda.graph", "replay", "convert_to_float8_training"],
    },
}
MEDIAN_NAMES, MAX_NAMES = 12, 24  # library names a notebook imports
FULL_SECONDS, ALL_FULL_SECONDS, QUICK_SECONDS = 600, 1800, 120  # the reader's time budget, per notebook and all


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _python(source: str) -> str:
    """The cell as Python: a %%writefile body is the script it writes; other magics and shell lines are no code."""
    lines = source.splitlines()
    if lines and lines[0].startswith("%%"):
        if not lines[0].startswith("%%writefile"):
            return ""
        lines = lines[1:]
    return "\n".join(re.match(r"\s*", x).group() + "pass" if x.lstrip().startswith(("%", "!")) else x for x in lines)


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "?")
    return ".".join(reversed(parts))


def code_names(source: str) -> set[str]:
    """Every dotted name, attribute chain, keyword argument ('name=') and imported name in a cell's code."""
    names = set()
    for node in ast.walk(ast.parse(_python(source))):
        if isinstance(node, (ast.Attribute, ast.Name)):
            names.add(_dotted(node))
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(f"{node.arg}=")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(f"{node.module}.{a.name}" if isinstance(node, ast.ImportFrom) else a.name for a in node.names)
    return names


def has_name(names: set[str], wanted: str) -> bool:
    if wanted.endswith("="):
        return wanted in names
    return any(n == wanted or n.endswith("." + wanted) for n in names)


def sections(notebook: dict) -> dict[str, set[str]]:
    """Section heading (## or ###) -> the names in its code cells; a ### section's code counts for its ## too."""
    found, current, parent = {}, "(top)", "(top)"
    for cell in notebook["cells"]:
        source = _source(cell)
        if cell["cell_type"] == "markdown":
            for line in source.splitlines():
                if line.startswith("## "):
                    current = parent = line
                elif line.startswith("### "):
                    current = line
        elif cell["cell_type"] == "code":
            names = code_names(source)
            found.setdefault(current, set()).update(names)
            found.setdefault(parent, set()).update(names)
    return found


def library_names(notebook: dict) -> set[str]:
    """The names a notebook imports from tricks_lib (``import tricks_lib.x`` counts as one)."""
    imported = set()
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse(_python(_source(cell)))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tricks_lib"):
                imported.update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names if a.name.startswith("tricks_lib"))
    return imported


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_notebook_has_its_tricks_listed():
    assert {p.stem for p in NOTEBOOKS} <= set(TRICK_CALLS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_trick_section_shows_its_own_pytorch_lines(path):
    found = sections(_load(path))
    missing = []
    for heading, wanted in TRICK_CALLS[path.stem].items():
        matches = [h for h in found if heading in h]
        assert matches, f"{path.name}: no section heading contains {heading!r}"
        names = set().union(*(found[h] for h in matches))
        missing += [f"{heading}: {w}" for w in wanted if not has_name(names, w)]
    assert not missing, f"{path.name}: these tricks' own lines are not in their sections' code: {missing}"


def test_the_section_check_reads_code_not_comments_or_strings():
    names = code_names("# torch.compile(model)\ns = 'model.to(memory_format=torch.channels_last)'\nopt.zero_grad()")
    assert not has_name(names, "torch.compile") and not has_name(names, "memory_format=")
    assert has_name(names, "zero_grad") and not has_name(names, "grad")
    written = code_names("%%writefile {folder}/worker.py\nimport torch.distributed as dist\ndist.init_process_group()")
    assert has_name(written, "init_process_group")


def test_the_notebooks_import_few_library_names():
    counts = {p.stem: len(library_names(_load(p))) for p in NOTEBOOKS}
    assert statistics.median(counts.values()) <= MEDIAN_NAMES, counts
    assert max(counts.values()) <= MAX_NAMES, counts


def test_the_recorded_run_times_meet_the_readers_budget():
    ledger = json.loads((ROOT / "notebooks" / LEDGER_NAME).read_text(encoding="utf-8"))
    full = {p.stem: ledger[p.stem]["full"]["seconds"] for p in NOTEBOOKS}
    quick = {p.stem: ledger[p.stem]["quick"]["seconds"] for p in NOTEBOOKS}
    assert max(full.values()) <= FULL_SECONDS, full
    assert sum(full.values()) <= ALL_FULL_SECONDS, sum(full.values())
    assert max(quick.values()) <= QUICK_SECONDS, quick


def _stored(notebook: dict, key: str) -> list[tuple[int, object]]:
    """(cell index, value) of every output whose tricks_lib metadata holds ``key``."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            for meta in output.get("metadata", {}).values():
                if isinstance(meta, dict) and key in meta.get("tricks_lib", {}):
                    found.append((index, meta["tricks_lib"][key]))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_ends_with_what_to_copy_and_every_line_ran(path):
    notebook = _load(path)
    copies = _stored(notebook, "what_to_copy")
    assert len(copies) == 1, f"{path.name}: expected one what-to-copy cell, found {len(copies)}"
    (copy_cell, items), verdict_cells = copies[0], [i for i, _ in _stored(notebook, "verdict_rows")]
    assert verdict_cells and copy_cell >= max(verdict_cells), f"{path.name}: what to copy comes after the verdicts"
    rows = {r["trick"]: r for _, rows in _stored(notebook, "verdict_rows") for r in rows}
    code = [
        {line.strip() for line in _source(c).splitlines()}
        for c in notebook["cells"][:copy_cell]
        if c["cell_type"] == "code"
    ]
    for item in items:
        row = rows[item["trick"]]
        assert row["helped"] == item["helped"], item["trick"]
        if row["helped_from"] == "outcome":
            assert item["helped"] == (row["outcome"] == "faster"), (item["trick"], row["outcome"])
        lines = [x.strip() for x in item["lines"].splitlines() if x.strip() and not x.strip().startswith("#")]
        assert any(all(x in cell for x in lines) for cell in code), (
            f"{path.name}: the lines to copy for {item['trick']!r} are not one cell's code: {item['lines']!r}"
        )
