"""neuro-plot on run dirs written by real short CartPole runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from master.observe.plot import OUTPUTS, load_run, main, throughput
from tests.support.processes import REPO, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS

GENERATIONS = {"run-a": 3, "run-b": 4}


def train(run_dir: Path, generations: int, seed: int) -> subprocess.Popen:
    """A real master with one local worker; a few seconds of CartPole."""
    command = [sys.executable, "-m", "master", *LOCAL_CARTPOLE_ARGS,
               "--generations", str(generations), "--population", "10",
               "--quiet", "--seed", str(seed), "--run-dir", str(run_dir)]  # fmt: skip
    return subprocess.Popen(command, env=worker_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory: pytest.TempPathFactory, noise_cache: Path) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    dirs = [root / name for name in GENERATIONS]
    masters = [train(d, GENERATIONS[d.name], seed) for seed, d in enumerate(dirs, 1)]
    for master in masters:
        _, stderr = master.communicate(timeout=120)
        assert master.returncode == 0, stderr[-3000:]
    return dirs


def neuro_plot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "master.observe.plot", *args], env=worker_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip


def read_png(path: Path) -> np.ndarray:
    image = imread(path)
    assert image.dtype == np.float32 and image.ndim == 3  # RGBA in [0, 1]
    return image


def has_colour(image: np.ndarray, rgb: tuple[int, int, int]) -> bool:
    """Whether some pixel is (within rounding) this colour: a run's lines are drawn."""
    return bool((np.abs(image[..., :3] * 255 - rgb).max(axis=-1) < 2).any())


C0_BLUE, C1_ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # matplotlib's first two colours


@pytest.mark.slow
def test_plots_one_run_dir_into_itself(run_dirs: list[Path]) -> None:
    run = run_dirs[0]
    done = neuro_plot(str(run), "--size", "6x4", "--dpi", "50")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(run / name) for name in OUTPUTS]
    for name in OUTPUTS:
        image = read_png(run / name)
        assert image.shape[:2] == (4 * 50, 6 * 50)  # rows = height * dpi
        assert image[..., :3].var() > 0
        assert has_colour(image, C0_BLUE) and not has_colour(image, C1_ORANGE)


@pytest.mark.slow
def test_plots_two_run_dirs_on_shared_axes(run_dirs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "compare"
    done = neuro_plot(*map(str, run_dirs), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(out / name) for name in OUTPUTS]
    for name in OUTPUTS:
        image = read_png(out / name)
        assert image.shape[:2] == (600, 1000)  # the default 10x6 inches at 100 dpi
        assert image[..., :3].var() > 0
        assert has_colour(image, C0_BLUE) and has_colour(image, C1_ORANGE)
    assert not any((run_dirs[1] / name).exists() for name in OUTPUTS)


@pytest.mark.slow
def test_reads_every_generation_and_computes_throughput_between_lines(
    run_dirs: list[Path],
) -> None:
    run = load_run(run_dirs[1])
    assert run.label == "run-b (CartPole-v1)"
    lines = [json.loads(x) for x in (run_dirs[1] / "metrics.jsonl").read_text().splitlines()]
    assert run.records == lines and len(lines) == GENERATIONS["run-b"]
    generations, frames_per_s, evaluations_per_s = throughput(run)
    assert generations == [1, 2, 3]
    for g, fps, eps in zip(generations, frames_per_s, evaluations_per_s, strict=True):
        seconds = lines[g]["wall_s"] - lines[g - 1]["wall_s"]
        assert fps == pytest.approx(lines[g]["generation_frames"] / seconds)
        assert eps == pytest.approx(lines[g]["generation_evaluations"] / seconds)
        assert lines[g]["generation_evaluations"] == 10 + 2 * 2


@pytest.mark.slow
def test_skips_a_truncated_last_line_with_a_warning(
    run_dirs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = tmp_path / "live"
    shutil.copytree(run_dirs[0], live)
    metrics = live / "metrics.jsonl"
    complete = metrics.read_text()
    metrics.write_text(complete + complete.splitlines()[-1][:25])  # a line half written
    assert main([str(live), "--size", "4x3", "--dpi", "40"]) == 0
    captured = capsys.readouterr()
    assert f"skipped the truncated last line 4 of {metrics}" in captured.err
    assert captured.out.split() == [str(live / name) for name in OUTPUTS]
    assert len(load_run(live, warn=lambda _: None).records) == 3
    assert read_png(live / OUTPUTS[0]).shape[:2] == (120, 160)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d, "has no metrics.jsonl: not a run dir"),
        (lambda d: (d / "metrics.jsonl").write_text(""), "holds no complete generation yet"),
        (lambda d: (d / "metrics.jsonl").write_text('{"generation": 0'), "no complete generation"),
        (lambda d: (d / "metrics.jsonl").write_text("oops\n{}\n"), "line 1 is not JSON"),
        (lambda d: (d / "metrics.jsonl").write_text('{"generation": 0}\n'), "line 1 lacks frames"),
    ],
)
def test_refuses_a_dir_without_usable_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make, message: str
) -> None:
    make(tmp_path)
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and str(tmp_path) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_refuses_a_missing_dir_and_bad_options(
    run_dirs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    # The second dir is checked before anything is drawn for the first.
    assert main([str(run_dirs[0]), str(missing), "--out", str(tmp_path / "out")]) == 2
    assert f"{str(missing)!r} is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    for bad in (["--size", "6by4"], ["--size", "0x4"], ["--dpi", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            main([str(run_dirs[0]), *bad])
        assert exit_info.value.code == 2
        assert bad[1] in capsys.readouterr().err
