"""neuro-eval and evaluate_policy: replaying a real run's genome, with and without video."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest

from neuro.noise import NoiseTableSpec
from tests.support.processes import REPO, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS
from worker import evaluate_policy
from worker.cli import eval_main
from worker.offline.video import Video

SUMMARY = re.compile(r"mean (\S+) std (\S+) min (\S+) max (\S+) over (\d+) episodes")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, noise_cache: Path) -> Path:
    """A real short CartPole run: its best_genome.json is what neuro-eval replays."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    command = [sys.executable, "-m", "master", *LOCAL_CARTPOLE_ARGS,
               "--generations", "3", "--population", "10", "--quiet",
               "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def neuro_eval(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "import sys; from worker.cli import eval_main; "
               "sys.exit(eval_main())", *args]  # fmt: skip
    return subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def printed_scores(stdout: str) -> list[float]:
    (line,) = [x for x in stdout.splitlines() if x.startswith("scores: ")]
    return [float(x) for x in line.removeprefix("scores: ").split()]


def count_frames(path: Path) -> tuple[int, dict]:
    with imageio.get_reader(path, format="FFMPEG") as reader:
        return reader.count_frames(), reader.get_meta_data()


@pytest.mark.slow
def test_run_dir_and_genome_file_print_what_evaluate_policy_returns(run_dir: Path) -> None:
    genome = run_dir / "best_genome.json"
    expected = evaluate_policy(genome, episodes=6, env_seed=11)
    assert len(set(expected)) > 1  # distinct episodes: the seeding is really exercised
    for target in (run_dir, genome):
        done = neuro_eval(str(target), "--episodes", "6", "--seed", "11")
        assert done.returncode == 0, done.stderr
        assert printed_scores(done.stdout) == expected
        mean, std, low, high, count = SUMMARY.search(done.stdout).groups()
        assert float(mean) == pytest.approx(statistics.fmean(expected), abs=0.05)
        assert float(std) == pytest.approx(statistics.pstdev(expected), abs=0.05)
        assert (float(low), float(high), int(count)) == (min(expected), max(expected), 6)
        says_run_dir = f"{run_dir} is a run dir: replaying its best_genome.json"
        assert (says_run_dir in done.stdout) == (target == run_dir)


@pytest.mark.slow
def test_video_holds_steps_plus_one_frames_per_recorded_episode(
    run_dir: Path, tmp_path: Path
) -> None:
    """Two of three episodes recorded; the scores are those of the unrecorded replay."""
    out = tmp_path / "videos" / "replay.mp4"
    done = neuro_eval(str(run_dir), "--episodes", "3", "--seed", "5", "--video", str(out),
                      "--video-episodes", "2")  # fmt: skip
    assert done.returncode == 0, done.stderr
    scores = printed_scores(done.stdout)
    assert scores == evaluate_policy(run_dir, episodes=3, env_seed=5)
    # CartPole pays 1 per step, so an episode's steps are its return; one frame after the
    # reset and one after each step.
    expected_frames = [int(scores[0]) + 1, int(scores[1]) + 1]
    frames, meta = count_frames(out)
    assert frames == sum(expected_frames)
    assert meta["fps"] == 50.0 and meta["size"] == (600, 400)  # CartPole's render_fps, frame
    shown = " + ".join(map(str, expected_frames))
    assert f"wrote {out}: episodes 1-2, {frames} frames ({shown}) at 50 fps" in done.stdout
    assert [p.name for p in out.parent.iterdir()] == ["replay.mp4"]  # no partial file left


@pytest.mark.slow
def test_recording_does_not_change_the_returns(run_dir: Path, tmp_path: Path) -> None:
    plain = evaluate_policy(run_dir, episodes=4, env_seed=21)
    video = Video(tmp_path / "one.mp4")
    assert evaluate_policy(run_dir, episodes=4, env_seed=21, video=video) == plain
    assert video.episodes == 1 and video.frames == [int(plain[0]) + 1]
    assert count_frames(tmp_path / "one.mp4")[0] == int(plain[0]) + 1
    with imageio.get_reader(tmp_path / "one.mp4", format="FFMPEG") as reader:
        first = reader.get_data(0)
    assert first.shape == (400, 600, 3) and first.var() > 0  # the rendered cart, not blank


def test_atari_video_is_the_full_colour_screen(tmp_path: Path, noise_cache: Path) -> None:
    """Frostbite through the paper's protocol: 210x160 colour frames, not 84x84 gray."""
    settings = dict(architecture="nature", noise_table=NoiseTableSpec(size=2**24),
                    max_episode_steps=30, episodes=2, env_seed=3)  # fmt: skip
    video = Video(tmp_path / "frostbite.mp4")
    returns = evaluate_policy("Frostbite-v4", [7], video=video, **settings)
    assert returns == evaluate_policy("Frostbite-v4", [7], **settings)
    assert video.frames == [31] and video.fps == 30.0  # 30 capped steps + the reset frame
    frames, meta = count_frames(tmp_path / "frostbite.mp4")
    assert frames == 31 and meta["size"] == (160, 210)
    with imageio.get_reader(tmp_path / "frostbite.mp4", format="FFMPEG") as reader:
        frame = reader.get_data(10).astype(np.int16)
    assert np.abs(frame[..., 0] - frame[..., 2]).max() > 50  # colour: channels differ


@pytest.mark.slow
def test_missing_video_packages_are_named_before_any_episode(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "imageio", None)  # import imageio now fails
    out = tmp_path / "none.mp4"
    assert eval_main([str(run_dir), "--episodes", "2", "--video", str(out)]) == 2
    captured = capsys.readouterr()
    assert "pip install 'neuro[video]'" in captured.err and "imageio" in captured.err
    assert "scores:" not in captured.out and not out.exists()


@pytest.mark.slow
def test_missing_renderer_is_named(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "pygame", None)  # classic control renders with pygame
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")  # as eval_main sets it; restored after
    out = tmp_path / "none.mp4"
    assert eval_main([str(run_dir), "--episodes", "1", "--video", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pygame" in err and "pip install 'neuro[video]'" in err
    assert list(tmp_path.iterdir()) == []  # neither the video nor its partial file


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--video", "out.avi"], "--video must name an .mp4 file, got 'out.avi'"),
        (["--video-episodes", "2"], "--video-episodes needs --video"),
        (["--episodes", "3", "--video", "o.mp4", "--video-episodes", "4"], "got 4"),
        (["--episodes", "0"], "--episodes must be >= 1, got 0"),
    ],
)
@pytest.mark.slow
def test_refuses_bad_options(run_dir: Path, capsys, args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        eval_main([str(run_dir), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_names_a_run_dir_without_a_genome(tmp_path: Path, capsys) -> None:
    assert eval_main([str(tmp_path)]) == 2
    assert f"run dir {str(tmp_path)!r} has no best_genome.json" in capsys.readouterr().err
