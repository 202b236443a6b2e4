"""Inference: conv+BN fusion and re-parameterization, lower precision and its error, compiled and frozen
graphs, fake-quantized weights, and the same code timed in fresh processes under other environments.

Modules: ``conversions`` (``fuse_conv_bn``, ``reparameterize``, ``output_error``, ``serialized_size``),
``repvgg`` (``RepVGGBlock``), ``compiled`` (``compile_frozen``, ``compiled_source``, ``frozen_parameters``,
``export_for_fresh_processes``), ``fake_quant`` (1-8 bit weights), ``accuracy_table`` (accuracy, error and
size of lossy variants against one reference), ``env_compare`` (``compare_environments``: allocators and
OpenMP settings, each in its own process), ``env_workers`` (those worker processes;
``evaluate_in_environments``), ``allocators`` (jemalloc and tcmalloc: found here, and really preloaded).
"""

from tricks_lib.inference.accuracy_table import AccuracyCost, AccuracyTable
from tricks_lib.inference.allocators import ALLOCATORS, allocator_environments, find_shared_library, loaded_allocators
from tricks_lib.inference.compiled import compile_frozen, compiled_source, export_for_fresh_processes, frozen_parameters
from tricks_lib.inference.conversions import (
    OutputError,
    count_modules,
    fuse_conv_bn,
    output_error,
    reparameterize,
    serialized_size,
)
from tricks_lib.inference.env_compare import EnvironmentComparison, compare_environments
from tricks_lib.inference.env_workers import evaluate_in_environments
from tricks_lib.inference.fake_quant import (
    SUPPORTED_BITS,
    WeightFakeQuant,
    fake_quantize,
    fake_quantize_weights,
    weight_levels,
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
    "compile_frozen",
    "compiled_source",
    "count_modules",
    "evaluate_in_environments",
    "export_for_fresh_processes",
    "fake_quantize",
    "fake_quantize_weights",
    "find_shared_library",
    "frozen_parameters",
    "fuse_conv_bn",
    "loaded_allocators",
    "output_error",
    "reparameterize",
    "serialized_size",
    "weight_levels",
]
