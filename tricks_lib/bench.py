"""The timing harness in one import: ``measure``, ``compare``, ``time_first_call`` and their results.

Its parts live in one module per concern, and can be imported from there too:

- ``tricks_lib.timing``: ``measure``, ``time_first_call`` (one callable's timed loop);
- ``tricks_lib.comparing``: ``compare`` (variants in interleaved rounds; also importable from ``timing``);
- ``tricks_lib.measurements``: ``Measurement``, ``ComparisonRow``, ``Comparison`` (the result values);
- ``tricks_lib.stats``: the paired interval behind "significant", as pure functions;
- ``tricks_lib.formatting``: seconds, bytes and tables for people.
"""

from tricks_lib.comparing import compare
from tricks_lib.formatting import format_seconds
from tricks_lib.measurements import Comparison, ComparisonRow, Measurement
from tricks_lib.timing import measure, time_first_call

__all__ = ["Comparison", "ComparisonRow", "Measurement", "compare", "format_seconds", "measure", "time_first_call"]
