"""neuro-master report: what the report writes (report.md, report.json, learning curves as PNG)
and prints (a one-screen summary), from the numbers master/observe/report.py reads."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from master.observe.published import PAPER_COLUMN, Published
from master.observe.report import (
    LAST_ELITE_SOURCE,
    Band,
    EnvSummary,
    Report,
    ReportError,
    RunOutcome,
    is_study_dir,
    median_range,
    read_report,
)
from master.observe.status import printable

REPORT_JSON_FORMAT = "neuro.report/1"
REPORT_MD = "report.md"
REPORT_JSON = "report.json"
CURVES = "curves.png"
CURVES_DIR = "curves"
DEFAULT_OUT = "report"
"""Under the study dir, or (for plain run dirs) under the current directory."""
PUBLISHED_SHOWN = ("GA", "GA-6B", "DQN", "A3C", "ES", "RS")
"""The published columns beside each env, in this order."""
NONE = "—"
PLOT_EXTRA_HINT = "install the `plot` extra: pip install 'neuro[plot]'"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _count(value: float | None) -> str:
    """A frame count for people: 5.00M, 1.00B, 350k."""
    if value is None:
        return NONE
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


def _score(value: float | None) -> str:
    return NONE if value is None else f"{value:,.1f}"


def _hours(value: float | None) -> str:
    """Core-hours to three significant figures (0.0042, 1.23, 87.6, 1,234)."""
    if value is None:
        return NONE
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _share(ratio: float) -> str:
    """A fraction of the paper's frames as a percentage to two significant figures."""
    return f"{ratio * 100:.2g}%"


def _label(summary: EnvSummary) -> str:
    env = summary.env_id or "unknown env"
    return f"{env} ({summary.label})" if summary.label else env


def curve_names(summaries: Sequence[EnvSummary]) -> list[str]:
    """One file name per env summary under curves/: the env id (and label), made safe."""
    names: list[str] = []
    for summary in summaries:
        parts = [summary.env_id or "unknown-env", *([summary.label] if summary.label else [])]
        stem = _UNSAFE.sub("_", "-".join(parts)).strip("._") or "env"
        name, n = f"{stem}.png", 2
        while name in names:
            name, n = f"{stem}-{n}.png", n + 1
        names.append(name)
    return names


def frames_vs_paper(summary: EnvSummary, published: Published) -> float | None:
    """The runs' median frames as a fraction of the paper's GA frames (None: not a paper game)."""
    median = median_range(summary.frames)
    if summary.game is None or median is None:
        return None
    return median[0] / float(published.columns[PAPER_COLUMN]["frames"])


# -- report.md ----------------------------------------------------------------------------------


def markdown(report: Report, curves: dict[int, str] | None) -> str:
    """The report for people: a table per env beside the paper, each run, the curves."""
    study, runs, summaries, published = report.study, report.runs, report.envs, report.published
    labelled = any(summary.label for summary in summaries)
    title = f"Study {study}" if study else "Runs"
    lines = [f"# {title}: the report", ""]
    lines.append(
        f"{len(runs)} runs, {len(summaries)} env{'s' if len(summaries) != 1 else ''}"
        f"{' and settings' if labelled else ''}. Scores are the final elite's mean "
        "score on fresh test episodes (final_test.json), median and range over the "
        "runs (seeds)."
    )
    lines += ["", "## Scores beside the paper", ""]
    header = [
        "env",
        *(["label"] if labelled else []),
        "runs",
        "score median",
        "score range",
        "frames (median)",
        "frames (total)",
        "frames vs paper",
        "core-hours",
        "generations",
        *(f"{column} (paper)" for column in PUBLISHED_SHOWN),
    ]
    lines += [_row(header), _row(["---"] * len(header))]
    for summary in summaries:
        lines.append(_row(_table_cells(summary, published, labelled)))
    lines.append("")
    if any(summary.from_last_elite for summary in summaries):
        lines += [
            "† some runs have no final test: their score is the last generation's elite "
            "score, the mean of its re-evaluation episodes in training (biased upwards by "
            "the selection), not a test on fresh episodes.",
            "",
        ]
    if any(summary.core_hours_estimated for summary in summaries):
        lines += [
            "est.: some runs' metrics have no worker_s; their core-hours are estimated from "
            "their frames at the measured throughput for their network and dtype.",
            "",
        ]
    lines += [*_published_lines(summaries, published), ""]
    lines += ["## Runs", ""]
    header = [
        "run",
        "env",
        *(["label"] if labelled else []),
        "seed",
        "state",
        "generations",
        "frames",
        "score",
        "from",
        "core-hours",
        "notes",
    ]
    lines += [_row(header), _row(["---"] * len(header))]
    for run in runs:
        lines.append(_row(_run_cells(run, labelled)))
    lines.append("")
    lines += ["## Learning curves", ""]
    if curves is None:
        lines += [f"Not drawn: matplotlib is missing ({PLOT_EXTRA_HINT}).", ""]
    elif not curves:
        lines += ["No run has finished a generation yet.", ""]
    else:
        lines += [
            "The elite score against frames: median over the runs, the band their "
            "min-max (interquartile range from 4 runs); each run interpolated onto a "
            "common grid of frames, up to its own last frame. The dashed line is the "
            "population's mean score, median over the runs.",
            "",
        ]
        for index, name in curves.items():
            lines += [f"![{_label(summaries[index])}]({CURVES_DIR}/{name})", ""]
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    # Names come from study.json and run dirs: a pipe or a line break would break the table.
    return "| " + " | ".join(" ".join(c.replace("|", "\\|").split()) for c in cells) + " |"


def _table_cells(summary: EnvSummary, published: Published, labelled: bool) -> list[str]:
    scores = median_range(summary.scores)
    dagger = " †" if summary.from_last_elite else ""
    frames = median_range(summary.frames)
    ratio = frames_vs_paper(summary, published)
    hours = summary.core_hours
    hours_text = _hours(hours)
    if hours is not None and summary.core_hours_estimated:
        hours_text += " est."
    if hours is not None and summary.core_hours_missing:
        hours_text += f" ({summary.core_hours_missing} unknown)"
    generations = median_range(summary.generations)
    row = summary.published or {}
    runs = (
        f"{len(summary.scored)} of {len(summary.runs)}"
        if len(summary.scored) != len(summary.runs)
        else str(len(summary.runs))
    )
    return [
        summary.env_id or "unknown env",
        *([summary.label or NONE] if labelled else []),
        runs,
        NONE if scores is None else _score(scores[0]) + dagger,
        NONE if scores is None else f"{_score(scores[1])} to {_score(scores[2])}",
        _count(frames[0] if frames else None),
        _count(sum(summary.frames) if frames else None),
        NONE if ratio is None else f"{_share(ratio)} of {_count(_paper_frames(published))}",
        hours_text,
        NONE if generations is None else f"{generations[0]:g}",
        *(f"{row[column]:,.0f}" if column in row else NONE for column in PUBLISHED_SHOWN),
    ]


def _paper_frames(published: Published) -> float:
    return float(published.columns[PAPER_COLUMN]["frames"])


def _run_cells(run: RunOutcome, labelled: bool) -> list[str]:
    hours = _hours(run.core_hours)
    if run.core_hours_estimated:
        hours += " est."
    source = run.score_source or NONE
    if run.test_episodes is not None:
        source += f" ({run.test_episodes} episodes)"
    return [
        run.name,
        run.env_id or "?",
        *([run.label or NONE] if labelled else []),
        NONE if run.seed is None else str(run.seed),
        run.state or NONE,
        str(run.generations),
        _count(run.frames),
        _score(run.score) + (" †" if run.score_source == LAST_ELITE_SOURCE else ""),
        source,
        hours,
        "; ".join(run.problems) or "",
    ]


def _published_lines(summaries: Sequence[EnvSummary], published: Published) -> list[str]:
    """What the published columns are, and the runs' frames against the paper's."""
    lines = [f"Published figures: {published.source} ({published.url}); {published.score}.", ""]
    for key in PUBLISHED_SHOWN:
        column = published.columns[key]
        lines.append(f"- {key}: {column['method']}, {_count(column['frames'])} training frames")
    lines += [f"- {note}" for note in published.notes]
    ratios = [r for s in summaries if (r := frames_vs_paper(s, published)) is not None]
    paper = _count(_paper_frames(published))
    if ratios:
        share = _share(min(ratios))
        if _share(max(ratios)) != share:
            share += f" to {_share(max(ratios))}"
        lines.append(
            f"- This report's runs of the paper's games trained {share} of the GA's {paper} "
            "frames (median over seeds, per game): their scores are comparable with the "
            "paper's only at equal frames."
        )
    else:
        lines.append("- None of this report's envs is one of the paper's games.")
    return lines


# -- report.json --------------------------------------------------------------------------------


def report_document(report: Report, curves: dict[int, str] | None) -> dict[str, Any]:
    """The same numbers, machine-readable (strict JSON: null where there is no value); run dirs
    of a study are named relative to it."""
    summaries, published = report.envs, report.published
    envs = []
    for index, summary in enumerate(summaries):
        scores, frames = median_range(summary.scores), median_range(summary.frames)
        generations = median_range(summary.generations)
        band, mean_band = summary.band(), summary.mean_band()
        envs.append(
            {
                "env_id": summary.env_id,
                "label": summary.label,
                "game": summary.game,
                "runs": [run.name for run in summary.runs],
                "score": None
                if scores is None
                else {
                    "median": scores[0],
                    "min": scores[1],
                    "max": scores[2],
                    "runs": len(summary.scored),
                    "from_final_test": summary.from_final_test,
                    "from_last_elite": summary.from_last_elite,
                },
                "frames": None
                if frames is None
                else {
                    "median": frames[0],
                    "min": frames[1],
                    "max": frames[2],
                    "total": sum(summary.frames),
                    "vs_paper": frames_vs_paper(summary, published),
                },
                "core_hours": {
                    "total": summary.core_hours,
                    "estimated": summary.core_hours_estimated,
                    "runs_unknown": summary.core_hours_missing,
                },
                "generations": None
                if generations is None
                else {"median": generations[0], "min": generations[1], "max": generations[2]},
                "published": summary.published,
                "curve": None if band is None else _band_document(band, (curves or {}).get(index)),
                "mean_curve": None
                if mean_band is None
                else _band_document(mean_band, (curves or {}).get(index)),
            }
        )
    return {
        "format": REPORT_JSON_FORMAT,
        "study": report.study,
        "published": {
            "source": published.source,
            "url": published.url,
            "score": published.score,
            "notes": list(published.notes),
            "columns": published.columns,
            "compared_column": PAPER_COLUMN,
        },
        "envs": envs,
        "runs": [_run_document(run, report.study_dir) for run in report.runs],
    }


def _band_document(band: Band, name: str | None) -> dict[str, Any]:
    return {
        "file": f"{CURVES_DIR}/{name}" if name else None,
        "spread": band.spread,
        "frames": list(band.frames),
        "median": list(band.median),
        "low": list(band.low),
        "high": list(band.high),
        "runs": list(band.runs),
    }


def _run_document(run: RunOutcome, base: Path | None) -> dict[str, Any]:
    path = run.path
    if base is not None:
        path = path.relative_to(base)
    return {
        "name": run.name,
        "dir": path.as_posix(),
        "env_id": run.env_id,
        "label": run.label,
        "seed": run.seed,
        "state": run.state,
        "generations": run.generations,
        "frames": run.frames,
        "score": run.score,
        "score_source": run.score_source,
        "test_episodes": run.test_episodes,
        "core_hours": run.core_hours,
        "core_hours_estimated": run.core_hours_estimated,
        "problems": list(run.problems),
    }


# -- the summary on stdout ----------------------------------------------------------------------


def _score_span(scores: tuple[float, float, float], marked: bool) -> str:
    median, low, high = scores
    return f"{_score(median)} [{_score(low)}, {_score(high)}]" + (" †" if marked else "")


def summary_table(summaries: Sequence[EnvSummary], runs: Sequence[RunOutcome]) -> str:
    """One line per env: runs, score median [range], frames, core-hours, the paper's GA."""
    rows = [("env", "runs", "score median [min, max]", "frames", "core-h", "GA (paper)")]
    for summary in summaries:
        scores, frames = median_range(summary.scores), median_range(summary.frames)
        hours = summary.core_hours
        paper = (summary.published or {}).get(PAPER_COLUMN)
        rows.append((
            printable(_label(summary)),
            f"{len(summary.scored)}/{len(summary.runs)}",
            NONE if scores is None else _score_span(scores, bool(summary.from_last_elite)),
            _count(frames[0] if frames else None),
            _hours(hours) + ("~" if hours is not None and summary.core_hours_estimated else ""),
            NONE if paper is None else f"{paper:,.0f}",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    troubled = sum(bool(run.problems) for run in runs)
    if troubled:
        lines.append(
            f"{troubled} of {len(runs)} runs have notes (missing final test, "
            f"half-written files, ...): see {REPORT_MD}"
        )
    if any(summary.from_last_elite for summary in summaries):
        lines.append("† includes runs scored by their last elite (no final test)")
    if any(summary.core_hours_estimated for summary in summaries):
        lines.append("~ core-hours partly estimated from frames (no worker_s)")
    return "\n".join(lines)


# -- curves -------------------------------------------------------------------------------------


def plot_curves(
    summaries: Sequence[EnvSummary],
    out_dir: Path,
    dpi: int = 100,
) -> dict[int, str] | None:
    """curves/<env>.png per env with a curve, and curves.png with them all side by side.

    Returns {summary index: file name under curves/}; None where matplotlib is missing.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import EngFormatter
    except ImportError:
        return None
    drawn = [(i, band) for i, s in enumerate(summaries) if (band := s.band()) is not None]
    names = curve_names(summaries)
    if not drawn:
        return {}
    (out_dir / CURVES_DIR).mkdir(parents=True, exist_ok=True)

    def draw(axes: Any, summary: EnvSummary, band: Band) -> None:
        # Runs of one budget end at different frames: where only some reach, the median and
        # band are drawn fainter and dashed, so a run dropping out is not read as learning.
        most = max(band.runs)
        full = [count == most for count in band.runs]
        partial = [not f for f in full]
        for where, alpha, style, label in (
            (full, 0.25, "-", f"elite, median of {most} runs"),
            (partial, 0.1, ":", "elite, median of fewer runs (the others end before)"),
        ):
            if not any(where):
                continue
            median = [m if w else math.nan for m, w in zip(band.median, where, strict=True)]
            axes.fill_between(band.frames, band.low, band.high, where=where, color="C0",
                              alpha=alpha, lw=0, interpolate=True)  # fmt: skip
            axes.plot(band.frames, median, color="C0", linestyle=style, label=label)
        axes.fill_between([], [], [], color="C0", alpha=0.25, lw=0,
                          label=f"{band.spread} over runs")  # fmt: skip
        mean = summary.mean_band()
        if mean is not None:
            axes.plot(mean.frames, mean.median, color="C2", lw=1, linestyle="--",
                      label="population mean (median of runs)")  # fmt: skip
        paper = (summary.published or {}).get(PAPER_COLUMN)
        if paper is not None:
            axes.axhline(
                paper,
                color="C3",
                linestyle="--",
                lw=1,
                label=f"paper's GA at 1B frames: {paper:,.0f}",
            )
        axes.set(title=_label(summary), xlabel="emulator frames", ylabel="score")
        axes.xaxis.set_major_formatter(EngFormatter())
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")

    written: dict[int, str] = {}
    for index, band in drawn:
        fig = Figure(figsize=(7, 4.5), dpi=dpi, layout="constrained")
        FigureCanvasAgg(fig)
        draw(fig.subplots(), summaries[index], band)
        fig.savefig(out_dir / CURVES_DIR / names[index], dpi=dpi, format="png")
        written[index] = names[index]
    columns = min(3, len(drawn))
    rows = math.ceil(len(drawn) / columns)
    fig = Figure(figsize=(6 * columns, 4 * rows), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(rows, columns, squeeze=False).ravel()
    for axes, (index, band) in zip(grid, drawn, strict=False):
        draw(axes, summaries[index], band)
    for axes in grid[len(drawn) :]:
        axes.set_visible(False)
    fig.savefig(out_dir / CURVES, dpi=dpi, format="png")
    return written


# -- the command --------------------------------------------------------------------------------


def write_report(paths: Sequence[str | Path], out_dir: Path) -> tuple[list[Path], str]:
    """Reads the runs and writes report.md, report.json and the curves into `out_dir`.

    Returns the files written and the summary (the table, and why no curves were drawn, where
    none were); ReportError for a path that is neither a
    study dir nor a run dir, OSError where the files cannot be written.
    """
    report = read_report(paths)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = plot_curves(report.envs, out_dir)
    written = [out_dir / REPORT_MD, out_dir / REPORT_JSON]
    written[0].write_text(markdown(report, curves) + "\n")
    document = report_document(report, curves)
    written[1].write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    summary = summary_table(report.envs, report.runs)
    if curves is None:
        summary += f"\nno learning curves: matplotlib is missing ({PLOT_EXTRA_HINT})"
    elif not curves:
        summary += "\nno learning curves: no run has finished a generation yet"
    else:
        written.append(out_dir / CURVES)
        written += [out_dir / CURVES_DIR / name for name in curves.values()]
    return written, summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuro-master report",
        description="Report a study dir (or run dirs): per env, the median and range over "
        "seeds of the final elite's test score, frames, core-hours and generations beside the "
        "published figures of Such et al. 2017 (Table 1); learning curves as PNG; the numbers "
        f"as JSON. Writes {REPORT_MD}, {REPORT_JSON}, {CURVES} and {CURVES_DIR}/<env>.png.",
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="DIR",
        help="a study dir (holding study.json and runs/), or one or more run dirs",
    )
    p.add_argument(
        "--out",
        default=None,
        help=f"folder for the report (default: STUDY_DIR/{DEFAULT_OUT}; for run dirs, "
        f"./{DEFAULT_OUT})",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """neuro-master report STUDY_DIR [--out DIR] (or RUN_DIR [RUN_DIR ...])."""
    args = build_parser().parse_args(argv)
    out = (
        Path(args.out)
        if args.out
        else (Path(args.paths[0]) / DEFAULT_OUT if is_study_dir(args.paths) else Path(DEFAULT_OUT))
    )
    try:
        written, summary = write_report(args.paths, out)
    except ReportError as error:
        print(f"neuro-master report: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        where = error.filename or out
        print(f"neuro-master report: cannot write {where}: {error.strerror}", file=sys.stderr)
        return 1
    print(summary)
    print()
    for path in written:
        print(f"wrote {path}")
    return 0
