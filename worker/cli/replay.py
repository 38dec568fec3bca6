"""neuro-eval: replay a saved genome under the training protocol, optionally as video."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def eval_parser() -> argparse.ArgumentParser:
    """neuro-eval's arguments."""
    parser = argparse.ArgumentParser(
        prog="neuro-eval",
        description="Replay a saved genome under the training protocol and print its score "
        "statistics; optionally record it as video.",
    )
    parser.add_argument(
        "genome",
        metavar="RUN_DIR|GENOME.json",
        help="a run dir (replays its best_genome.json) or a genome file such as "
        "RUN_DIR/elite_genome.json",
    )
    parser.add_argument("--episodes", type=int, default=30, help="default %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="seeds the first episode's reset")
    parser.add_argument(
        "--video",
        metavar="OUT.mp4",
        default=None,
        help="record the first --video-episodes episodes to this mp4, from the env's "
        "full-colour frames; the scores are the same as without (needs the video extra: "
        "pip install 'neuro[video]')",
    )
    parser.add_argument(
        "--video-episodes",
        type=int,
        default=None,
        help="episodes to record, one after another in one file (default 1)",
    )
    return parser


def replay(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Checks the arguments, replays the genome and prints its scores; returns the exit code."""
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    if args.video and Path(args.video).suffix.lower() != ".mp4":
        parser.error(f"--video must name an .mp4 file, got {args.video!r}")
    if args.video_episodes is not None and args.video is None:
        parser.error("--video-episodes needs --video")
    video_episodes = 1 if args.video_episodes is None else args.video_episodes
    if args.video and not 1 <= video_episodes <= args.episodes:
        parser.error(f"--video-episodes must be between 1 and --episodes ({args.episodes}), "
                     f"got {video_episodes}")  # fmt: skip
    from worker.evaluation.evaluator import mean_and_spread
    from worker.offline.replay import evaluate_policy, load_genome_file, resolve_genome_path

    video = None
    try:
        path = resolve_genome_path(args.genome)
        spec = load_genome_file(path)
        if args.video:
            from worker.offline.video import Video, require_video_packages

            require_video_packages()  # before minutes of episodes, not after
            # Frames are rendered off screen: no window, and no display needed.
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            video = Video(args.video, episodes=video_episodes)
        if path != Path(args.genome):
            print(f"{args.genome} is a run dir: replaying its {path.name} ({path})")
        print(f"{spec.env_id}: {args.episodes} episodes, the first reset seeded with {args.seed}")
        scores = evaluate_policy(path, episodes=args.episodes, env_seed=args.seed, video=video)
    except (ValueError, ImportError) as error:
        print(f"neuro-eval: {error}", file=sys.stderr)
        return 2
    print("scores: " + " ".join(str(score) for score in scores))
    print(f"{path}: {mean_and_spread(scores)}")
    if video is not None:
        recorded = "episode 1" if video.episodes == 1 else f"episodes 1-{video.episodes}"
        # One frame after each reset and one after each step: steps + 1 per episode.
        print(f"wrote {video.path}: {recorded}, {sum(video.frames)} frames "
              f"({' + '.join(map(str, video.frames))}) at {video.fps:g} fps")  # fmt: skip
    return 0
