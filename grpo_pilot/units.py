"""Units and element sizes: the one home of GiB/MiB/GB, FLOP/s scales and bytes per dtype element.

Integer bytes everywhere inside the tool; GiB appear only where numbers are printed.
"""

from __future__ import annotations

GiB = 1 << 30
MiB = 1 << 20
GB = 10**9
TFLOPS = 10**12
BF16_BYTES = 2
FP32_BYTES = 4
