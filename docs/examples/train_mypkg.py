"""Trains mypkg's env with mypkg's network from Python, replays the best genome and exports it.

pip install -e docs/examples/mypkg        # or: export PYTHONPATH=docs/examples/mypkg
python docs/examples/train_mypkg.py runs/mypkg-python
"""

from __future__ import annotations

import sys

import numpy as np

import neuro


def main(run_dir: str) -> None:
    # Ctrl-C stops it resumably: run the script again to continue.
    result = neuro.train(
        "mypkg:MyEnv-v0",
        policy="mypkg.nets:make_policy",
        budget=10,
        workers=2,
        run_dir=run_dir,
        population=50,
        target_score=None,
    )
    print(f"{result.generations} generations, best elite score {result.best_score}")
    policy = neuro.load_policy(result)  # a torch module with the best genome's weights
    observations = np.zeros((3, 4), dtype=np.float32)
    print("greedy actions of three observations:", policy.act(observations))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/mypkg-python")
