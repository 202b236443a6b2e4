"""Model design: what FLOPs miss, ShuffleNet V2's tables and TRT-ViT's hybrids measured, pruning, distillation.

Modules: ``flops`` (FLOPs with ``FlopCounterMode``, memory access of conv layers and of element-wise ops;
ranking by FLOPs vs latency), ``probe_tables`` (ShuffleNet V2's Tables 1-4 and this machine's timings of the
probe networks, written out in notebook 04, read against them), ``hybrid_probes`` (TRT-ViT-style
conv/transformer networks of equal FLOPs), ``pruning`` (structured channel slicing), ``distill`` (the
distillation gains over seeds).
"""

from tricks_lib.design.distill import DistillationGains, distillation_gains, paired_gain_verdict
from tricks_lib.design.flops import (
    FlopRanking,
    conv1x1_memory_access_cost,
    conv_memory_access_cost,
    count_elementwise_access,
    count_flops,
    count_memory_access,
    rank_by_flops,
)
from tricks_lib.design.hybrid_probes import HYBRID_LAYOUTS, hybrid_net, hybrid_nets
from tricks_lib.design.probe_tables import (
    SHUFFLENET_V2_TABLES,
    ProbeTable,
    ProbeTrends,
    paper_throughput_ratios,
    trend_against_paper,
)
from tricks_lib.design.pruning import kept_channel_counts, prune_conv_channels

__all__ = [
    "DistillationGains",
    "FlopRanking",
    "HYBRID_LAYOUTS",
    "ProbeTable",
    "ProbeTrends",
    "SHUFFLENET_V2_TABLES",
    "conv1x1_memory_access_cost",
    "conv_memory_access_cost",
    "count_elementwise_access",
    "count_flops",
    "count_memory_access",
    "distillation_gains",
    "hybrid_net",
    "hybrid_nets",
    "kept_channel_counts",
    "paired_gain_verdict",
    "paper_throughput_ratios",
    "prune_conv_channels",
    "rank_by_flops",
    "trend_against_paper",
]
