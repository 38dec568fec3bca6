"""The one row quantiser and the one bfloat16 rounding every engine computes with (numpy).

Engines of the same dtype must compute with the same numbers, so each of these is written
once: the int8 dense layer's integers on torch (fbgemm) and on ONNX Runtime, and int8-static's
7-bit weights, all come from `quantise_rows`; int8's bfloat16 convolution weights on ONNX
Runtime from `bfloat16_values`, which rounds as torch's `.to(torch.bfloat16)` does
(tests/worker/inference/test_quantise.py holds both to torch's).
"""

from __future__ import annotations

import numpy as np

MIN_SCALE = np.float32(1e-30)
"""Floor of a scale (an all-zero row's, a dead layer's, an all-zero input's), so that nothing
divides by zero: such a row quantises to zeros."""
INT8_LEVELS = 127
"""int8's dense weights: symmetric, 8 bits."""


def quantise_rows(weight: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 weights (out, ...) as int8 integers round-half-even(w x (1 / scale)) in
    [-levels, levels], and one float32 scale per output row, max|w| / levels.

    The reciprocal, not a division: torch's quantize_per_channel and fbgemm compute it so, and
    the two round differently."""
    rows = np.asarray(weight, dtype=np.float32).reshape(len(weight), -1)
    scale = np.maximum(np.abs(rows).max(axis=1) / np.float32(levels), MIN_SCALE)
    integers = np.multiply(rows, (np.float32(1) / scale)[:, None])
    np.rint(integers, out=integers)
    np.clip(integers, -levels, levels, out=integers)
    return integers.astype(np.int8).reshape(np.shape(weight)), scale.astype(np.float32)


def bfloat16_values(array: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even) and back to float32."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + (np.uint32(0x7FFF) + lowest_kept)) & np.uint32(0xFFFF0000)
    values = rounded.view(np.float32)
    nan = np.isnan(array)
    if nan.any():  # a NaN's payload could round into infinity: keep it a NaN
        values = np.where(nan, np.float32(np.nan), values)
    return values.reshape(np.shape(array))
