"""A worker checks every size a task names against its limits before it allocates for it."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from neuro.envs import memorize, register_envs
from neuro.layout import parameter_layout
from neuro.noise import NoiseTableSpec
from neuro.v1 import evolution_pb2 as pb
from tests.support.processes import REPO as ROOT
from worker.client.link import fetch_parameters
from worker.client.wire import spec_from_task
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.inference.policy import build_policy

GOOD = EvaluationSpec(env_id="CartPole-v1", seeds=(1, 2, 3), mutation_power=0.05,
                      noise_table=NoiseTableSpec(seed=123, size=2**16), architecture="mlp",
                      hidden_sizes=(64, 64), episodes=2, max_episode_steps=500)  # fmt: skip
HUGE_HIDDEN = (50_000, 50_000)
"""2.5e9 parameters: a 10 GB network, whatever the env."""


def _count(architecture: str, hidden: tuple[int, ...], inputs: int = 1, outputs: int = 1) -> int:
    layout = parameter_layout(architecture, (inputs,), outputs, hidden)
    return sum(math.prod(shape) for _, shape in layout)


def _run_capped(imports: str, body: str, headroom: int = 1 << 30) -> str:
    """Runs `body` in a fresh interpreter whose address space, once `imports` are done, is
    capped at its size plus `headroom`: an allocation beyond that is a MemoryError there."""
    script = (
        textwrap.dedent(imports)
        + textwrap.dedent(f"""
        import resource
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + {headroom}, size + {headroom}))
        try:
        """)
        + textwrap.indent(textwrap.dedent(body), "    ")
        + textwrap.dedent("""
        except ValueError as error:
            print("REFUSED", error)
        except MemoryError as error:
            print("OUT OF MEMORY", error)
        else:
            print("ACCEPTED")
        """)
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


# -- toy envs -----------------------------------------------------------------------------


def test_toy_task_refuses_absurd_sizes_before_building_its_dataset():
    with pytest.raises(ValueError, match="20000"):
        memorize.check_task(20_000, 20_000, 0)
    with pytest.raises(ValueError, match=r"neuro/Memorize-K20000-D20000-v0.*20000"):
        register_envs("neuro/Memorize-K20000-D20000-v0")
    with pytest.raises(ValueError, match=str(memorize.MAX_NUM_EXAMPLES + 1)):
        memorize.check_task(memorize.MAX_NUM_EXAMPLES + 1, 1, 0)
    with pytest.raises(ValueError, match=str(memorize.MAX_OBS_DIM + 1)):
        memorize.check_task(1, memorize.MAX_OBS_DIM + 1, 0)
    # The largest allowed dataset is still a small one.
    assert memorize.MAX_DATASET_VALUES * 8 <= 256 * 2**20
    # The limit leaves every size the docs and presets use.
    memorize.check_task(10_000, 64, 0)


def test_toy_env_constructor_refuses_before_allocating():
    # 20000 x 20000 float64 is 3.2 GB: under a 1 GiB cap, allocating first is a MemoryError.
    outcome = _run_capped(
        "from neuro.envs.memorize import Memorize\n",
        "Memorize(num_examples=20_000, obs_dim=20_000)\n",
    )
    assert outcome.startswith("REFUSED") and "20000" in outcome, outcome


# -- the task spec --------------------------------------------------------------------------


def _bad_specs() -> list[tuple[dict, str]]:
    from worker import limits

    table = GOOD.noise_table.size
    return [
        ({"hidden_sizes": (limits.MAX_HIDDEN_WIDTH + 1,)}, str(limits.MAX_HIDDEN_WIDTH + 1)),
        ({"hidden_sizes": (0,)}, "got 0"),
        ({"hidden_sizes": (4,) * (limits.MAX_HIDDEN_LAYERS + 1)},
         str(limits.MAX_HIDDEN_LAYERS + 1)),
        ({"hidden_sizes": HUGE_HIDDEN}, str(_count("mlp", HUGE_HIDDEN))),
        # Fits the worker, not the noise table: 16M parameters, a 65536-value table.
        ({"hidden_sizes": (4096, 4096)}, f"{_count('mlp', (4096, 4096))} parameters.*{table}"),
        ({"episodes": 0}, "got 0"),
        ({"episodes": limits.MAX_EPISODES + 1}, str(limits.MAX_EPISODES + 1)),
        ({"max_episode_steps": limits.MAX_EPISODE_STEPS + 1}, str(limits.MAX_EPISODE_STEPS + 1)),
        ({"seeds": tuple(range(limits.MAX_SEEDS + 1))}, str(limits.MAX_SEEDS + 1)),
        ({"env_id": "x" * (limits.MAX_ENV_ID_LENGTH + 1)}, str(limits.MAX_ENV_ID_LENGTH + 1)),
        ({"env_id": ""}, "got 0"),
    ]  # fmt: skip


def test_spec_check_refuses_each_value_out_of_range_and_names_it():
    from worker.limits import check_spec

    assert check_spec(GOOD) is GOOD
    for change, message in _bad_specs():
        with pytest.raises(ValueError, match=message):
            check_spec(dataclasses.replace(GOOD, **change))


def test_spec_check_accepts_the_papers_atari_task():
    from worker.limits import check_spec

    paper = dataclasses.replace(
        GOOD, env_id="ALE/Frostbite-v5", architecture="deepga", hidden_sizes=(),
        noise_table=NoiseTableSpec(), seeds=tuple(range(1000)), episodes=30,
        max_episode_steps=27_000,
    )  # fmt: skip
    assert check_spec(paper) is paper


def _task(**policy: object) -> pb.Task:
    return pb.Task(
        task_id="g0/o/0/0", run_id="r", episodes=1,
        env=pb.EnvSpec(env_id="CartPole-v1"), policy=pb.PolicySpec(architecture="mlp", **policy),
        genome=pb.Genome(seeds=[1, 2], mutation_power=0.05,
                         noise_table=pb.NoiseTableSpec(seed=123, size=2**24)),
    )  # fmt: skip


def test_a_task_off_the_wire_that_cannot_fit_is_refused_naming_the_value():
    assert spec_from_task(_task(hidden_sizes=[64, 64])).hidden_sizes == (64, 64)
    with pytest.raises(ValueError, match=str(_count("mlp", HUGE_HIDDEN))):
        spec_from_task(_task(hidden_sizes=list(HUGE_HIDDEN)))
    task = _task()
    task.genome.noise_table.size = 2**40  # 4 TiB of noise
    with pytest.raises(ValueError, match=str(2**40)):
        spec_from_task(task)


# -- the network ----------------------------------------------------------------------------


def test_a_network_over_the_limit_is_refused_before_its_parameters_are_allocated():
    # 2**16 x 2**16 hidden weights: 17 GB of float32. Under a 1 GiB cap, allocating first is a
    # MemoryError; the check must come first and name the count.
    count = _count("mlp", (2**16, 2**16), inputs=8, outputs=2)
    outcome = _run_capped(
        "import gymnasium as gym\nimport torch\nfrom worker.inference.policy import build_policy\n",
        "build_policy('mlp', gym.spaces.Box(-1, 1, (8,)), gym.spaces.Discrete(2), (2**16, 2**16))",
    )
    assert outcome.startswith("REFUSED") and str(count) in outcome, outcome
    # A wide observation with a modest layer is refused the same way.
    wide = gym.spaces.Box(-1, 1, (2**20,))
    with pytest.raises(ValueError, match=str(_count("mlp", (256,), inputs=2**20, outputs=2))):
        build_policy("mlp", wide, gym.spaces.Discrete(2), (256,))


def test_a_network_larger_than_the_noise_table_is_refused_before_the_table_is_built(tmp_path):
    evaluator = Evaluator(noise_cache_dir=str(tmp_path))
    spec = dataclasses.replace(GOOD, noise_table=NoiseTableSpec(seed=9, size=1000))
    policy = build_policy("mlp", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), (64, 64))
    with pytest.raises(ValueError, match=f"{policy.num_params}.*1000"):
        evaluator.decoders.decoder(spec, policy.spec)
    with pytest.raises(ValueError, match=f"{policy.num_params}.*1000"):
        evaluator.parameters(dataclasses.replace(spec, perturbation=(0, 1, 1, 0.1)), policy.spec)
    assert not list(tmp_path.glob("*.f32"))


# -- ES parameter fetch ------------------------------------------------------------------------


class _Stub:
    """FetchParameters streaming `chunks`, counting how many the worker pulled."""

    def __init__(self, chunks: list[pb.ParametersChunk]) -> None:
        self.chunks, self.pulled = chunks, 0

    def FetchParameters(self, request, timeout=None):  # the gRPC method's name
        for chunk in self.chunks:
            self.pulled += 1
            yield chunk


def _stream(data: bytes, total: int, chunk_bytes: int = 1024) -> list[pb.ParametersChunk]:
    digest = hashlib.sha256(data).hexdigest()
    return [
        pb.ParametersChunk(version=1, offset=offset, data=data[offset : offset + chunk_bytes],
                           total_bytes=total, sha256=digest)
        for offset in range(0, len(data), chunk_bytes)
    ]  # fmt: skip


def test_fetch_refuses_a_stream_declared_too_large_before_accumulating_it():
    from neuro.layout import MAX_PARAMS

    data = np.arange(1280, dtype="<f4").tobytes()  # 5 chunks
    declared = 4 * (MAX_PARAMS + 1)
    stub = _Stub(_stream(data, declared))
    with pytest.raises(ValueError, match=str(declared)):
        fetch_parameters(stub, "w", 1, hashlib.sha256(data).hexdigest())
    assert stub.pulled == 1


def test_fetch_refuses_a_stream_that_disagrees_with_the_tasks_parameter_count():
    data = np.arange(1280, dtype="<f4").tobytes()
    digest = hashlib.sha256(data).hexdigest()
    stub = _Stub(_stream(data, len(data)))
    with pytest.raises(ValueError, match=f"{len(data)}.*{4 * 1000}"):
        fetch_parameters(stub, "w", 1, digest, num_params=1000)
    assert stub.pulled == 1
    # More bytes than it declared: refused at the chunk that overflows.
    stub = _Stub(_stream(data, 2048))
    with pytest.raises(ValueError, match="2048"):
        fetch_parameters(stub, "w", 1, digest)
    assert stub.pulled == 3
    # A consistent stream still arrives whole.
    theta = fetch_parameters(_Stub(_stream(data, len(data))), "w", 1, digest, num_params=1280)
    np.testing.assert_array_equal(theta, np.arange(1280, dtype=np.float32))


# -- end to end ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_refuses_an_oversized_task_reports_it_and_takes_the_next(
    tmp_path: Path, noise_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from master.fleet.leases import LeaseTable
    from tests.support.harness import live_master
    from tests.support.processes import spawn_worker, stop_processes
    from tests.support.tiny import tiny_cartpole

    reported: list[str] = []
    fail_task = LeaseTable.fail_task

    def recording(self, task_id: str, error: str, *args, **kwargs):
        reported.append(error)
        return fail_task(self, task_id, error, *args, **kwargs)

    monkeypatch.setattr(LeaseTable, "fail_task", recording)

    async def run() -> tuple[bool, int]:
        config = tiny_cartpole(generations=1, target_score=None, population_size=4,
                               elite_candidates=1, elite_episodes=1)  # fmt: skip
        # A master of another version, or a buggy one: a master that checks its own config
        # refuses this network, so the setting is forced past that check here.
        object.__setattr__(config, "hidden_sizes", HUGE_HIDDEN)
        async with live_master(config, tmp_path / "run") as live:
            worker = spawn_worker(live.port, "small", stderr=subprocess.DEVNULL)
            # A worker that allocated first would take 10 GB; capped, it gets a MemoryError.
            resource.prlimit(worker.pid, resource.RLIMIT_AS, (4 << 30, 4 << 30))
            try:
                deadline = time.monotonic() + 90
                while len(reported) < 3 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if worker.poll() is not None:
                    return False, 0
                status = Path(f"/proc/{worker.pid}/status").read_text()
                return True, int(status.split("VmHWM:")[1].split()[0])
            finally:
                stop_processes([worker])

    alive, peak_kib = asyncio.run(run())
    assert alive, "the worker died on a task it could not fit"
    assert len(reported) >= 3, reported
    assert all(str(_count("mlp", HUGE_HIDDEN)) in error for error in reported), reported
    # It never tried: the worker's peak memory is far below the network's 10 GB.
    assert peak_kib < 2 << 20, f"peak {peak_kib} KiB"
