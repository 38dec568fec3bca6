"""GPU utilisation and memory sampled once a second in a thread, for the throughput benches.

From nvidia-smi where it is on the PATH, else from torch.cuda.utilization() (which needs
pynvml) where an NVIDIA driver is loaded; with neither, no samples and a reason. torch is
imported only in that fallback, so a master measured on a CPU host never loads it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

NVIDIA_SMI_QUERY = ("--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits")
TORCH = "torch.cuda.utilization"


class GpuSampler:
    """Samples every `interval_s` between start() and stop(); summary() says what it saw.

    `query`: a command printing "utilisation, memory MiB" lines (one per GPU) as nvidia-smi's
    query does; None finds the source itself.
    """

    def __init__(self, interval_s: float = 1.0, query: Sequence[str] | None = None) -> None:
        self.interval_s = interval_s
        self._query = list(query) if query is not None else None
        self.source, self.reason = ("command", None) if query is not None else self._probe()
        self._utilisation: list[float] = []
        self._memory: list[float] = []
        self._errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"GpuSampler({self.source}, samples={len(self._utilisation)})"

    def _probe(self) -> tuple[str | None, str | None]:
        """(source, None) or (None, why there is none)."""
        smi = shutil.which("nvidia-smi")
        if smi is not None:
            self._query = [smi, *NVIDIA_SMI_QUERY]
            return "nvidia-smi", None
        if not os.path.exists("/proc/driver/nvidia/version"):
            return None, "no nvidia-smi on the PATH and no NVIDIA driver loaded"
        try:
            import torch

            if not torch.cuda.is_available():
                return None, "no nvidia-smi on the PATH, and torch sees no CUDA device"
            torch.cuda.utilization()
        except Exception as error:  # no torch, or no pynvml behind torch.cuda.utilization
            return None, f"no nvidia-smi on the PATH, and torch.cuda.utilization() failed: {error}"
        return TORCH, None

    def start(self) -> None:
        """Samples in a daemon thread from now on (nothing where there is no source)."""
        if self.source is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._sample()
            except (OSError, ValueError, IndexError, RuntimeError,
                    subprocess.SubprocessError) as error:  # fmt: skip
                if len(self._errors) < 5:  # the first few say why, not one a second
                    self._errors.append(f"{type(error).__name__}: {error}")
            if self._stop.wait(self.interval_s):
                return

    def _sample(self) -> None:
        if self.source == TORCH:
            import torch

            rates = [torch.cuda.utilization(i) for i in range(torch.cuda.device_count())]
            self._utilisation.append(statistics.fmean(rates))
            return
        assert self._query is not None
        done = subprocess.run(self._query, capture_output=True, text=True, timeout=10, check=True)
        rows = [[float(v) for v in line.split(",")] for line in done.stdout.strip().splitlines()]
        # Several GPUs: the mean of their utilisation, the sum of their memory.
        self._utilisation.append(statistics.fmean(row[0] for row in rows))
        self._memory.append(sum(row[1] for row in rows))

    def stop(self) -> float | None:
        """Stops sampling; the mean utilisation in percent (None without samples)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        return statistics.fmean(self._utilisation) if self._utilisation else None

    def summary(self) -> dict[str, Any]:
        """Mean and peak utilisation, peak memory, how many samples, from where; and why none."""
        reason = self.reason
        if reason is None and not self._utilisation:
            reason = "no sample answered" + (f": {self._errors[0]}" if self._errors else "")
        return {
            "utilisation_percent_mean": (
                statistics.fmean(self._utilisation) if self._utilisation else None
            ),
            "utilisation_percent_max": max(self._utilisation, default=None),
            "memory_used_mib_max": max(self._memory, default=None),
            "samples": len(self._utilisation),
            "interval_s": self.interval_s,
            "source": self.source,
            "reason": reason,
            "errors": list(self._errors),
        }
