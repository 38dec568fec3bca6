"""neuro-plot: training curves of one or more run dirs as PNG files (the `plot` extra)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuro.runfiles import CONFIG, METRICS

SCORE_VS_FRAMES = "score_vs_frames.png"
SCORE_VS_TIME = "score_vs_time.png"
THROUGHPUT = "throughput.png"
OUTPUTS = (SCORE_VS_FRAMES, SCORE_VS_TIME, THROUGHPUT)
REQUIRED_KEYS = ("generation", "frames", "evaluations", "wall_s", "score_mean", "score_max",
                 "elite_score")  # fmt: skip
# (key, legend entry, line style): one colour per run, one style per curve.
SCORE_CURVES = (
    ("elite_score", "elite (mean of its re-evaluation episodes)", "-"),
    ("score_max", "best individual of the generation", "--"),
    ("score_mean", "population mean", ":"),
)
PLOT_EXTRA_HINT = "install the `plot` extra: pip install 'neuro[plot]'"


@dataclass(frozen=True)
class RunCurves:
    """The complete generations of one run dir and its legend label."""

    path: Path
    label: str
    records: list[dict[str, Any]]

    def column(self, key: str) -> list[float]:
        """One metric per generation; NaN where the run recorded none (null)."""
        return [math.nan if r[key] is None else float(r[key]) for r in self.records]


def _warn(message: str) -> None:
    print(f"neuro-plot: warning: {message}", file=sys.stderr)


def load_run(path: str | Path, warn: Callable[[str], None] = _warn) -> RunCurves:
    """Reads RUN_DIR/metrics.jsonl; a truncated last line (a live run writing) is skipped."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{str(path)!r} is not a directory (expected a run dir)")
    metrics = path / METRICS
    if not metrics.is_file():
        raise ValueError(f"{str(path)!r} has no {METRICS}: not a run dir, or a run not started")
    lines = metrics.read_text().split("\n")
    tail = lines.pop()  # "" when the file ends with a newline, as complete files do
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            records.append(_parse_line(metrics, number, line))
    if tail.strip():
        try:
            # A line the master finished but for its newline still counts.
            records.append(_parse_line(metrics, len(lines) + 1, tail))
        except ValueError:
            warn(f"skipped the truncated last line {len(lines) + 1} of {metrics} "
                 "(a live run may be writing it)")  # fmt: skip
    if not records:
        raise ValueError(f"{metrics} holds no complete generation yet")
    return RunCurves(path, _label(path), records)


def _parse_line(metrics: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{metrics} line {number} is not JSON: {error.msg}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{metrics} line {number} is not a JSON object")
    missing = [key for key in REQUIRED_KEYS if key not in record]
    if missing:
        raise ValueError(f"{metrics} line {number} lacks {', '.join(missing)}")
    return record


def _label(path: Path) -> str:
    """The run dir's name and, from config.json, its env."""
    name = path.resolve().name
    try:
        env_id = json.loads((path / CONFIG).read_text()).get("env_id")
    except (OSError, ValueError, AttributeError):
        env_id = None  # a label without the env is still a label
    return f"{name} ({env_id})" if env_id else name


def throughput(run: RunCurves) -> tuple[list[int], list[float], list[float]]:
    """Per generation after the first: (generations, frames/s, evaluations/s), each from the
    differences between that generation's line and the previous one."""
    generations, frames_per_s, evaluations_per_s = [], [], []
    for before, after in zip(run.records, run.records[1:], strict=False):
        seconds = after["wall_s"] - before["wall_s"]
        ok = seconds > 0  # a clock that did not advance gives no rate, not a division error
        generations.append(int(after["generation"]))
        frames_per_s.append((after["frames"] - before["frames"]) / seconds if ok else math.nan)
        evaluations_per_s.append(
            (after["evaluations"] - before["evaluations"]) / seconds if ok else math.nan
        )
    return generations, frames_per_s, evaluations_per_s


def plot_runs(
    runs: Sequence[RunCurves],
    out_dir: str | Path,
    dpi: int = 100,
    size: tuple[float, float] = (10, 6),
) -> list[Path]:
    """Writes score_vs_frames.png, score_vs_time.png and throughput.png; returns their paths."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import EngFormatter, MaxNLocator
    except ImportError as error:
        raise ImportError(f"neuro-plot needs matplotlib ({error}); {PLOT_EXTRA_HINT}") from None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    colours = [f"C{i % 10}" for i in range(len(runs))]
    marker = "." if max(len(run.records) for run in runs) <= 60 else None

    def figure(rows: int = 1) -> tuple[Any, Any]:
        # A bare Figure on an Agg canvas: no pyplot state, no display.
        fig = Figure(figsize=size, dpi=dpi, layout="constrained")
        FigureCanvasAgg(fig)
        return fig, fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]

    def run_legend(axes: Any, styles: bool) -> None:
        handles = [
            Line2D([], [], color=c, label=run.label) for run, c in zip(runs, colours, strict=True)
        ]
        if styles:
            handles += [Line2D([], [], color="0.35", linestyle=s, label=label)
                        for _, label, s in SCORE_CURVES]  # fmt: skip
        axes.legend(handles=handles, fontsize="small")

    def score_plot(x_of: Callable[[RunCurves], list[float]], xlabel: str, title: str) -> Any:
        fig, (axes,) = figure()
        for run, colour in zip(runs, colours, strict=True):
            x = x_of(run)
            for key, _, style in SCORE_CURVES:
                axes.plot(x, run.column(key), color=colour, linestyle=style, marker=marker)
        axes.set(xlabel=xlabel, ylabel="episode score", title=title)
        axes.grid(alpha=0.3)
        run_legend(axes, styles=True)
        return fig, axes

    written = []
    fig, axes = score_plot(lambda r: r.column("frames"), "emulator frames", "Score vs frames")
    axes.xaxis.set_major_formatter(EngFormatter())
    written.append(_save(fig, out_dir / SCORE_VS_FRAMES, dpi))

    longest = max(max(run.column("wall_s")) for run in runs)
    unit, scale = (
        ("h", 3600.0) if longest > 3 * 3600 else ("min", 60.0) if longest > 180 else ("s", 1.0)
    )
    fig, _ = score_plot(lambda r: [t / scale for t in r.column("wall_s")],
                        f"wall time ({unit})", "Score vs wall time")  # fmt: skip
    written.append(_save(fig, out_dir / SCORE_VS_TIME, dpi))

    fig, (frames_axes, evaluations_axes) = figure(rows=2)
    for run, colour in zip(runs, colours, strict=True):
        generations, frames_per_s, evaluations_per_s = throughput(run)
        frames_axes.plot(generations, frames_per_s, color=colour, marker=marker)
        evaluations_axes.plot(generations, evaluations_per_s, color=colour, marker=marker)
    frames_axes.set(ylabel="frames/s", title="Throughput per generation")
    frames_axes.yaxis.set_major_formatter(EngFormatter())
    evaluations_axes.set(xlabel="generation", ylabel="evaluations/s")
    evaluations_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in (frames_axes, evaluations_axes):
        axes.grid(alpha=0.3)
        axes.set_ylim(bottom=0)
    run_legend(frames_axes, styles=False)
    written.append(_save(fig, out_dir / THROUGHPUT, dpi))
    return written


def _save(fig: Any, path: Path, dpi: int) -> Path:
    fig.savefig(path, dpi=dpi, format="png")
    return path


def _size(text: str) -> tuple[float, float]:
    try:
        width, height = (float(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected WxH in inches, e.g. 10x6, got {text!r}"
        ) from None
    if not (0 < width <= 100 and 0 < height <= 100):
        raise argparse.ArgumentTypeError(f"each side must be in (0, 100] inches, got {text!r}")
    return width, height


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="neuro-plot",
        description=f"Plot training curves of run dirs from their {METRICS}: "
        f"{SCORE_VS_FRAMES}, {SCORE_VS_TIME} and {THROUGHPUT}. Several run dirs share one "
        "set of plots, one colour per run.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument(
        "--out", default=None, help="folder for the PNGs (default: the first RUN_DIR)"
    )
    parser.add_argument("--dpi", type=int, default=100, help="pixels per inch (default 100)")
    parser.add_argument(
        "--size",
        type=_size,
        default=(10.0, 6.0),
        metavar="WxH",
        help="figure size in inches (default 10x6); a PNG is W*dpi x H*dpi pixels",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.dpi <= 1000:
        parser.error(f"--dpi must be between 1 and 1000, got {args.dpi}")
    try:
        runs = [load_run(path) for path in args.run_dirs]
        written = plot_runs(runs, args.out or args.run_dirs[0], args.dpi, args.size)
    except (ValueError, ImportError, OSError) as error:
        print(f"neuro-plot: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
