"""Inference: RepVGG re-parameterization, lower precision and its error, compiled and frozen
graphs, fake-quantized weights, and the same code timed in fresh processes under other environments.

Modules: ``conversions`` (``reparameterize``, ``output_error``),
``repvgg`` (``RepVGGBlock``), ``compiled`` (``export_for_fresh_processes``), ``fake_quant`` (1-8 bit weights), ``accuracy_table`` (accuracy, error and
size of lossy variants against one reference), ``env_compare`` (``compare_environments``: allocators and
OpenMP settings, each in its own process), ``env_workers`` (those worker processes;
``evaluate_in_environments``), ``allocators`` (jemalloc and tcmalloc: found here, and really preloaded).
"""

from tricks_lib.inference.accuracy_table import AccuracyCost, AccuracyTable
from tricks_lib.inference.allocators import ALLOCATORS, allocator_environments, find_shared_library, loaded_allocators
from tricks_lib.inference.compiled import export_for_fresh_processes
from tricks_lib.inference.conversions import OutputError, output_error, reparameterize
from tricks_lib.inference.env_compare import EnvironmentComparison, compare_environments
from tricks_lib.inference.env_workers import evaluate_in_environments
from tricks_lib.inference.fake_quant import (
    SUPPORTED_BITS,
    WeightFakeQuant,
    fake_quantize,
    fake_quantize_weights,
)
from tricks_lib.inference.repvgg import RepVGGBlock

__all__ = [
    "ALLOCATORS",
    "AccuracyCost",
    "AccuracyTable",
    "EnvironmentComparison",
    "OutputError",
    "RepVGGBlock",
    "SUPPORTED_BITS",
    "WeightFakeQuant",
    "allocator_environments",
    "compare_environments",
    "evaluate_in_environments",
    "export_for_fresh_processes",
    "fake_quantize",
    "fake_quantize_weights",
    "find_shared_library",
    "loaded_allocators",
    "output_error",
    "reparameterize",
]
