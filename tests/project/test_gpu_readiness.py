"""What a first CUDA run needs, checked without a GPU, from the stored notebooks (a CPU run of the main command).

- No check compares separate CUDA computations bit for bit: outside deterministic mode cuDNN and cuBLAS may pick
  other kernels or sum in another order from call to call. Every ``torch.equal`` and zero tolerance in the notebooks'
  code is either in a CPU-only expression or listed in ``EXACT_ON_EVERY_DEVICE`` with the reason it is exact.
- Every GPU-only cell (its work all inside a CUDA condition) shows on a CPU a line naming what it needs.
- On a CUDA device the full-mode sizes keep the GPU busy (``size_for_mode(..., cuda=)``), and the CPU keeps its own.
"""

import ast
import json
import os
import re
from pathlib import Path

import pytest
import torch

import tricks_lib.env as env

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(Path(os.environ.get("TRICKS_CHECK_NOTEBOOKS", ROOT / "notebooks")).glob("[0-9][0-9]_*.ipynb"))

# (notebook, a part of the line) -> why comparing bit for bit is right on every device, CUDA included.
EXACT_ON_EVERY_DEVICE = {
    ("01_data_io", "zip(epoch_ram(), epoch_memmap())"): "host tensors read back from two caches: the same bytes",
    ("01_data_io", "zip(ref, epoch_ram())"): "labels and shapes of host tensors",
    ("01_data_io", "host_batch.to(DEVICE).cpu()"): "a copy moves bytes, it computes nothing",
    ("02_training", "torch.full_like(w, images.shape[0])"): "a sum of ones: small integers, exact in fp32",
    ("02_training", "not any(torch.equal(p, q)"): "asserts that the update changed the tensors",
    ("02_training", "zip(before, scaler_model.parameters())"): "whether a step ran: a skipped one changes no bit",
    ("02_training", "params_identical"): "DDP ranks apply the same all-reduced gradients to the same weights",
    ("03_memory", "zip(start.parameters(), overflowed.parameters())"): "a skipped step leaves the weights untouched",
    ("06_time_analysis", "slow_data[i][1], fast_data[i][1]"): "labels: host integers",
    ("06_time_analysis", "torch.equal(x0, x1)"): "host batches from two loaders: the same samples",
    ("07_reproducibility", "own_noise[0], own_noise[1]"): "host random numbers from a seeded generator",
    ("07_reproducibility", "first_batch(False, 10)"): "sample indices drawn by a host generator",
    ("07_reproducibility", "first_batch(True, 10)"): "sample indices drawn by a host generator",
}
BITWISE = re.compile(r"torch\.equal\(|\brtol=0\b(?!\.)|\batol=0\b(?!\.)")
CPU_ONLY = re.compile(r"""device\.type == ["']cpu["']|\.cpu\(\)\.numpy\(\)""")
# A condition that holds on CUDA only (not its negation: "if not on_cuda" guards the CPU's branch).
CUDA_CONDITION = re.compile(
    r"""^(?!not )(?:.*\btype == ["']cuda["']|on_cuda\b|ON_GPU\b|torch\.cuda\.is_available\(\))"""
)
WORK_CALLS = ("compare(", ".add(", "display(")
NAMES_THE_NEED = re.compile(r"CUDA|GPU|cuDNN|nvjpeg", re.I)


def code_cells(path):
    for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] == "code":
            yield index, cell


def source_of(cell):
    src = "".join(cell["source"])
    return "\n".join("" if line.startswith(("%", "!")) else line for line in src.splitlines())


def text_of(outputs):
    parts = []
    for out in outputs:
        parts.append("".join(out.get("text", "")))
        data = out.get("data", {})
        parts.append("".join(data.get("text/markdown", "") or data.get("text/plain", "")))
    return "\n".join(parts)


def test_notebooks_are_found():
    assert len(NOTEBOOKS) >= 9, NOTEBOOKS


def test_no_bitwise_check_of_device_results_unless_it_is_exact_everywhere():
    unexplained, used = [], set()
    for path in NOTEBOOKS:
        for index, cell in code_cells(path):
            for line in source_of(cell).splitlines():
                code = line.split("#", 1)[0]
                if not BITWISE.search(code) or CPU_ONLY.search(code):
                    continue
                keys = [key for key in EXACT_ON_EVERY_DEVICE if key[0] == path.stem and key[1] in code]
                used.update(keys)
                if not keys:
                    unexplained.append(f"{path.stem} cell {index}: {line.strip()}")
    assert not unexplained, (
        "bit-for-bit checks of results that may differ from call to call on CUDA (outside deterministic mode); "
        "allow fp32 rounding there (e.g. 02's same_run), or list why it is exact in EXACT_ON_EVERY_DEVICE:\n"
        + "\n".join(unexplained)
    )
    stale = set(EXACT_ON_EVERY_DEVICE) - used
    if len(NOTEBOOKS) >= 9:  # a partial TRICKS_CHECK_NOTEBOOKS folder cannot tell a stale entry
        assert not stale, f"entries that match no line any more: {sorted(stale)}"


def gpu_only_cells(path):
    """(index, cell, source) of cells whose every work call sits inside a top-level CUDA-only `if`."""
    for index, cell in code_cells(path):
        source = source_of(cell)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        guarded, outside = False, False
        for node in tree.body:
            text = ast.unparse(node)
            if isinstance(node, ast.If) and CUDA_CONDITION.search(ast.unparse(node.test)) and not node.orelse:
                guarded = guarded or any(call in text for call in WORK_CALLS[:2])
            elif any(call in text for call in WORK_CALLS[:2]):
                outside = True
        if guarded and not outside:
            yield index, cell, source


def test_every_gpu_only_cell_says_on_a_cpu_what_it_needs():
    found, silent = [], []
    for path in NOTEBOOKS:
        for index, cell, _ in gpu_only_cells(path):
            found.append(f"{path.stem} cell {index}")
            if not NAMES_THE_NEED.search(text_of(cell.get("outputs", []))):
                silent.append(f"{path.stem} cell {index}")
    assert found, "no GPU-only cell found: the scan no longer reads the notebooks' CUDA conditions"
    if torch.cuda.is_available() or os.environ.get("TRICKS_DEVICE", "") not in ("", "cpu"):
        pytest.skip("the stored outputs of a CUDA run show the GPU's results, not the skip lines")
    assert not silent, f"GPU-only cells that show nothing on a CPU (say what they need): {silent}"


def test_the_scan_finds_a_gpu_only_cell_and_its_skip_line():
    cell = {
        "source": [
            'x = None\nif DEVICE.type == "cuda":\n    x = compare({})\n'
            'x if x is not None else Markdown("*Skipped: needs a CUDA GPU.*")'
        ],
        "outputs": [{"data": {"text/markdown": "*Skipped: needs a CUDA GPU.*"}}],
        "cell_type": "code",
    }
    cpu_cell = {"source": ['if not on_cuda:\n    display("x")\nelse:\n    compare({})'], "cell_type": "code"}

    class FakePath:
        stem = "fake"

        def read_text(self, encoding):
            return json.dumps({"cells": [cell, cpu_cell]})

    found = list(gpu_only_cells(FakePath()))
    assert [index for index, *_ in found] == [0]
    assert NAMES_THE_NEED.search(text_of(found[0][1]["outputs"]))


# notebook -> name -> its full-mode value on a CUDA device (the GPU's sizes); the CPU keeps the "full" value.
CUDA_SIZES = {
    "02_training": {"BATCH": 512, "WIDTH": 64, "TIMED_MODEL": "ResNet-50", "TIMED_BATCH": 128},
    "03_memory": {"BATCH": 512, "WIDTH": 64, "IMAGE": 64, "STACK_WIDTH": 2048},
    "05_inference": {"IMAGE_SIZE": 224, "RESNET_BATCH": 64},
}


def sizes_for(stem, device, monkeypatch):
    """The notebook's `NAME = size_for_mode(...)` values in full mode on `device`, evaluated in order."""
    monkeypatch.setenv("TRICKS_QUICK", "0")
    monkeypatch.setattr(env, "pick_device", lambda *a: torch.device(device))
    path = next(p for p in NOTEBOOKS if p.stem == stem)
    namespace = {"size_for_mode": env.size_for_mode, "ON_GPU": device == "cuda"}
    for _, cell in code_cells(path):
        try:
            tree = ast.parse(source_of(cell))
        except SyntaxError:
            continue
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and "size_for_mode(" in ast.unparse(node.value)
            ):
                try:
                    namespace[node.targets[0].id] = eval(compile(ast.Expression(node.value), stem, "eval"), namespace)
                except NameError:
                    continue
    return namespace


@pytest.mark.parametrize("stem", sorted(CUDA_SIZES))
def test_on_cuda_the_full_sizes_keep_the_gpu_busy_and_the_cpu_keeps_its_own(stem, monkeypatch):
    if not any(p.stem == stem for p in NOTEBOOKS):
        pytest.skip(f"{stem} is not in this folder")
    on_cuda = sizes_for(stem, "cuda", monkeypatch)
    on_cpu = sizes_for(stem, "cpu", monkeypatch)
    for name, expected in CUDA_SIZES[stem].items():
        assert on_cuda.get(name) == expected, (stem, name, on_cuda.get(name))
    # the CPU keeps its own full sizes (02's TIMED_BATCH happens to be 128 on both)
    assert {n: on_cpu.get(n) for n in CUDA_SIZES[stem]} != CUDA_SIZES[stem], (stem, "the CPU took the GPU's sizes")
