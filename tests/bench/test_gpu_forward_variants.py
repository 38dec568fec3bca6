"""bench/forward_variants.py: every variant of the batched pass timed and checked against float32.

The CPU run measures what a CPU can (channels-last, bfloat16, float16, unfold + bmm) and
skips, saying why, what needs CUDA; the same checks run on a CUDA host (make test-gpu), where
no variant is skipped.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.forward_variants import CUDA_ONLY, DEFAULT_VARIANTS, Variant, fastest, main


def test_variant_names_parse_and_unknown_ones_are_refused_by_name() -> None:
    variant = Variant.parse("bfloat16+unfold+graph")
    assert (variant.dtype, variant.flags) == ("bfloat16", {"unfold", "graph"})
    assert Variant.parse("float32").runner_path
    assert Variant.parse("float32+cudnn-benchmark").runner_path
    assert not Variant.parse("float32+direct").runner_path
    assert not Variant.parse("bfloat16").runner_path
    with pytest.raises(ValueError, match="'int4'"):
        Variant.parse("int4")
    with pytest.raises(ValueError, match="'winograd'"):
        Variant.parse("float32+winograd")
    for name in DEFAULT_VARIANTS:
        Variant.parse(name)


def _row(variant: str, batch: int, ms: float, agreement: float) -> dict[str, Any]:
    return {"variant": variant, "batch": batch, "status": "ok", "median_ms": ms,
            "agreement": agreement}  # fmt: skip


def test_the_fastest_variant_is_the_quickest_that_agrees_with_float32() -> None:
    results = [
        _row("float32", 8, 4.0, 1.0),
        _row("float16", 8, 1.0, 0.95),  # quickest, but plays another game: not taken
        _row("bfloat16+unfold", 8, 2.0, 0.9995),
        _row("float32+graph", 8, 3.0, 1.0),
        {"variant": "float32+unfold", "batch": 8, "status": "error", "reason": "x"},
        _row("float16", 32, 1.0, 1.0),  # no float32 reference at this batch: no verdict
    ]
    assert fastest(results) == {"8": {"variant": "bfloat16+unfold", "median_ms": 2.0,
                                      "float32_ms": 4.0, "speedup": 2.0}}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_variant_at_a_tiny_size(device: str) -> None:
    report = main(["--device", device, "--batches", "2", "3", "--repeats", "1",
                   "--agreement-rows", "6", "--budget-s", "600"])  # fmt: skip
    rows = {(r["variant"], r["batch"]): r for r in report["results"]}
    assert set(rows) == {(name, batch) for name in DEFAULT_VARIANTS for batch in (2, 3)}
    for (name, _), row in rows.items():
        variant = Variant.parse(name)
        if device == "cpu" and variant.flags & CUDA_ONLY.keys():
            assert row["status"] == "skipped" and row["reason"] in CUDA_ONLY.values()
            continue
        assert row["status"] == "ok", row
        assert row["median_ms"] > 0 and row["rows"] >= 6
        if variant.dtype == "float32":
            # The same function as the reference, to float32 rounding: the same actions.
            assert row["max_relative_difference"] < 1e-4, row
            assert row["agreement"] == 1.0, row
        else:
            # It ran in the reduced dtype (its outputs differ), and still computes the net.
            assert 0 < row["max_relative_difference"] < 0.5, row
            assert 0 <= row["agreement"] <= 1
    assert rows[("float32", 2)]["max_relative_difference"] <= 1e-6  # the reference itself
    for batch, best in report["fastest"].items():
        agreeing = [
            r["median_ms"]
            for (_, b), r in rows.items()
            if str(b) == batch and r["status"] == "ok" and r["agreement"] >= 0.999
        ]
        assert best["median_ms"] == min(agreeing)
    assert set(report["fastest"]) == {"2", "3"}
    if device == "cuda":
        assert report["machine"]["tf32"] == {"matmul": False, "cudnn": False}
