"""Model design: what FLOPs miss, the probe blocks of ShuffleNetV2's and TRT-ViT's guidelines, pruning, distillation.

Modules: ``flops`` (FLOPs with ``FlopCounterMode``, memory access of conv layers and of element-wise ops;
ranking by FLOPs vs latency), ``probe_blocks`` (the equal-FLOP probe networks of ShuffleNet V2's guidelines),
``probe_tables`` (the paper's Tables 1-4 and this machine's timings read against them), ``hybrid_probes``
(TRT-ViT-style conv/transformer networks of equal FLOPs), ``pruning`` (magnitude pruning sweeps and structured
channel slicing), ``distill`` (the distillation loss and its gains over seeds).
"""

from tricks_lib.design.distill import DistillationGains, distillation_gains, distillation_loss, paired_gain_verdict
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
from tricks_lib.design.probe_blocks import (
    bottleneck_net,
    channel_ratio_net,
    fragment_net,
    fragment_width,
    group_conv_net,
    group_widths,
    probe_input,
    ratio_channels,
    shufflenet_v2_probes,
)
from tricks_lib.design.probe_tables import (
    SHUFFLENET_V2_TABLES,
    ProbeTable,
    ProbeTrends,
    paper_throughput_ratios,
    trend_against_paper,
)
from tricks_lib.design.pruning import SparsitySweep, kept_channel_counts, magnitude_prune, prune_conv_channels

__all__ = [
    "DistillationGains",
    "FlopRanking",
    "HYBRID_LAYOUTS",
    "ProbeTable",
    "ProbeTrends",
    "SHUFFLENET_V2_TABLES",
    "SparsitySweep",
    "bottleneck_net",
    "channel_ratio_net",
    "conv1x1_memory_access_cost",
    "conv_memory_access_cost",
    "count_elementwise_access",
    "count_flops",
    "count_memory_access",
    "distillation_gains",
    "distillation_loss",
    "fragment_net",
    "fragment_width",
    "group_conv_net",
    "group_widths",
    "hybrid_net",
    "hybrid_nets",
    "kept_channel_counts",
    "magnitude_prune",
    "paired_gain_verdict",
    "paper_throughput_ratios",
    "probe_input",
    "prune_conv_channels",
    "rank_by_flops",
    "ratio_channels",
    "shufflenet_v2_probes",
    "trend_against_paper",
]
