"""Host-level measurements for bench/throughput.py and bench/gpu_host.py, each run in a process
pinned to one core.

The emulator ceiling (the C++ vector env, one process per core, all at once), the gymnasium
path for reference, memory bandwidth and peak matmul FLOP/s, and the cost of one forward pass
with its weights in cache (idle) and streamed from memory (loaded).
"""

from __future__ import annotations

import inspect
import math
import multiprocessing as mp
import time
import warnings
from pathlib import Path
from typing import Any

from bench.common import (
    ale_game,
    atari_vector_env,
    best_seconds,
    in_child,
    pin_to,
    step_vector_env,
)

LAYERS = ("conv1", "conv2", "conv3", "fc", "out")


def _emulator_child(engine: str, env_id: str, core: int, seconds: float, num_envs: int,
                    barrier: Any, queue: Any) -> None:  # fmt: skip
    """Steps one env (or one vector of num_envs) with random actions on one pinned core."""
    pin_to(core)
    import numpy as np

    rng = np.random.default_rng(core)
    if engine == "vector":
        env = atari_vector_env(env_id, num_envs)
        env.reset(seed=core)
        # Every process starts stepping at once: they share the L3 and the memory bus.
        barrier.wait()
        frames, steps, episodes, wall = step_vector_env(env, seconds, rng)
        env.close()
    else:
        from neuro.envs.make import make_env

        handle = make_env(env_id)
        handle.env.reset(seed=core)
        n_actions = int(handle.env.action_space.n)
        barrier.wait()
        steps = frames = episodes = episode_steps = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            _, _, terminated, truncated, _ = handle.env.step(int(rng.integers(n_actions)))
            steps += 1
            episode_steps += 1
            if terminated or truncated:
                frames += handle.frames_used(episode_steps)
                episodes += 1
                episode_steps = 0
                handle.env.reset()
        frames += handle.frames_used(episode_steps)
        wall = time.perf_counter() - started
    queue.put({"core": core, "frames": frames, "env_steps": steps, "episodes": episodes,
               "wall_s": wall, "frames_per_s": frames / wall,
               "ms_per_env_step": wall / max(1, steps) * 1e3})  # fmt: skip


def emulator(engine: str, env_id: str, processes: int, seconds: float, num_envs: int) -> dict:
    """One pinned process per core, all stepping at once; per process and total frames/s."""
    ctx = mp.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(processes)
    children = [ctx.Process(target=_emulator_child,
                            args=(engine, env_id, core, seconds, num_envs, barrier, queue))
                for core in range(processes)]  # fmt: skip
    for child in children:
        child.start()
    per_process = _collect(children, queue, seconds + 300)
    for child in children:
        child.join()
    total = sum(r["frames_per_s"] for r in per_process)
    return {
        "engine": "ale_py.vector_env.AtariVectorEnv" if engine == "vector" else "gymnasium",
        "game": ale_game(env_id) if engine == "vector" else env_id,
        "num_envs": num_envs if engine == "vector" else 1,
        "processes": processes,
        "per_process": per_process,
        "frames_per_s_total": total,
        "frames_per_s_per_core": total / processes,
        "ms_per_env_step": sum(r["ms_per_env_step"] for r in per_process) / processes,
    }


def _collect(children: list[Any], queue: Any, timeout: float) -> list[dict]:
    """Every child's report, by core; SystemExit naming the exit code of a child that died
    without one (the others, waiting for it at the barrier, are stopped), or the timeout."""
    import queue as queues

    deadline = time.monotonic() + timeout
    reports = []
    while len(reports) < len(children):
        try:
            reports.append(queue.get(timeout=1.0))
            continue
        except queues.Empty:
            pass
        dead = [child.exitcode for child in children if child.exitcode not in (None, 0)]
        if dead or time.monotonic() > deadline:
            for child in children:
                child.terminate()
            why = (f"exited with code {dead[0]} before reporting" if dead
                   else f"did not report within {timeout:.0f} s")  # fmt: skip
            raise SystemExit(f"an emulator process {why} (is ale-py installed, with its ROMs?)")
    return sorted(reports, key=lambda r: r["core"])


def _bandwidth_and_peak(megabytes: int, matrix: int, dtypes: list[str]) -> dict:
    """Copy bandwidth (numpy, read + write), one core's read bandwidth (a sum over the same
    buffer: what a pass whose weights are not in cache streams them at) and single-thread
    matmul peak (torch.mm)."""
    pin_to(0)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    n = megabytes * 2**20 // 8
    src, dst = np.ones(n), np.empty(n)
    np.copyto(dst, src)  # touch every page first: faults are not bandwidth
    bandwidth = 2 * n * 8 / best_seconds(lambda: np.copyto(dst, src))
    read_bandwidth = n * 8 / best_seconds(src.view(np.uint64).sum)
    peak: dict[str, float | None] = {}
    for dtype in dtypes:
        peak[dtype] = matmul_peak(torch, matrix, dtype)
    return {"copy_bytes": n * 8, "bytes_per_s": bandwidth, "read_bytes_per_s": read_bandwidth,
            "matrix": matrix, "peak_flop_per_s": peak}  # fmt: skip


def matmul_peak(torch: Any, size: int, dtype: str) -> float | None:
    """Best FLOP/s of a size x size matmul in this dtype on one thread; None if unsupported.

    int8 is timed on the kernel the worker's int8 dense layer runs, fbgemm's dynamically
    quantised linear (`torch._int_mm` has no fast path on AVX2 CPUs: ~1 GFLOP/s there)."""
    try:
        if dtype == "int8":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's quantised types are marked deprecated
                weight = torch.quantize_per_channel(
                    torch.randn(size, size), torch.full((size,), 0.02, dtype=torch.double),
                    torch.zeros(size, dtype=torch.long), 0, torch.qint8,
                )  # fmt: skip
                packed = torch.ops.quantized.linear_prepack(weight, None)
            a = torch.randn(size, size)

            def mm(x: Any, _: Any) -> Any:
                return torch.ops.quantized.linear_dynamic(x, packed, True)
        else:
            a = torch.randn(size, size).to(getattr(torch, dtype))
            mm = torch.mm
        b = a.clone()
        mm(a, b)
        best = best_seconds(lambda: mm(a, b))
    except (RuntimeError, AttributeError, TypeError):
        return None
    return 2 * size**3 / best


def bandwidth_and_peak(megabytes: int, matrix: int, dtypes: list[str]) -> dict:
    """Runs the bandwidth and peak measurement in a fresh pinned process."""
    return in_child(_bandwidth_and_peak, megabytes, matrix, dtypes)


def dtype_support() -> dict[str, Any]:
    """Whether build_policy takes an inference dtype, and which ones; the CPU's vector ISA as
    torch uses it, and which convolution dtypes oneDNN packs on it (on AVX2, bfloat16
    convolutions run as float32 ones on bfloat16 values)."""
    import torch

    from neuro.inference import INFERENCE_DTYPES
    from worker.inference import policy
    from worker.inference.engines.torch_cpu import layers

    parameters = inspect.signature(policy.build_policy).parameters
    keyword = next((k for k in ("inference_dtype", "dtype") if k in parameters), None)
    dtypes = list(INFERENCE_DTYPES) if keyword else ["float32"]
    fused = getattr(layers, "FUSED_CONV_DTYPES", None)
    return {
        "keyword": keyword,
        "dtypes": dtypes,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "packed_convolution_dtypes": None if fused is None else sorted(str(d) for d in fused),
    }


def _build(architecture: str, dtype: str, keyword: str | None, engine: str | None = None,
           env_id: str = "Frostbite-v4") -> Any:  # fmt: skip
    """A policy as a worker builds it (its default engine), or on `engine` where given; an
    int8-static one calibrated on `env_id`'s frames, as a worker calibrates it."""
    import gymnasium as gym
    import numpy as np

    from worker.inference.policy import build_policy

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    extra: dict[str, Any] = {keyword: dtype} if keyword else {}
    if engine is not None:
        extra["inference_engine"] = engine
    if dtype == "int8-static":
        from worker.play.calibration import calibration_observations

        extra["calibration"] = calibration_observations(env_id, "paper")
    return build_policy(architecture, space, gym.spaces.Discrete(18), **extra)


def _inference_module(policy: Any) -> Any:
    """The torch module a torch-engine pass runs (a reduced-precision copy where it keeps
    one)."""
    return policy.forward.inference_module


def _forward_costs(architecture: str, dtype: str, keyword: str | None, sets: int,
                   l3_bytes: int | None, repeats: int) -> dict:  # fmt: skip
    """Batch-1 forward ms with one weight set (cache-warm) and cycling many (from memory)."""
    pin_to(0)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    first = _build(architecture, dtype, keyword)
    weight_bytes = first.weight_bytes_per_forward()
    if l3_bytes:  # enough sets that together they are at least 4x the L3
        sets = max(sets, math.ceil(4 * l3_bytes / weight_bytes))
    policies = [first, *(_build(architecture, dtype, keyword) for _ in range(sets - 1))]
    scale = first.init_scale()
    for index, policy in enumerate(policies):
        rng = np.random.default_rng(index)
        policy.load_parameters(rng.standard_normal(first.num_params, np.float32) * scale)
    obs = np.random.default_rng(99).integers(0, 255, (1, 4, 84, 84), dtype=np.uint8)
    for policy in policies:
        policy.act_batch(obs)
    for _ in range(10):
        first.act_batch(obs)
    t = time.perf_counter()
    for _ in range(repeats):
        first.act_batch(obs)
    idle = (time.perf_counter() - t) / repeats * 1e3
    count = max(repeats, 2 * sets)
    t = time.perf_counter()
    for i in range(count):
        policies[i % sets].act_batch(obs)
    loaded = (time.perf_counter() - t) / count * 1e3
    batch8 = np.random.default_rng(1).integers(0, 255, (8, 4, 84, 84), dtype=np.uint8)
    first.act_batch(batch8)
    t = time.perf_counter()
    for _ in range(max(1, repeats // 4)):
        first.act_batch(batch8)
    batch8_ms = (time.perf_counter() - t) / max(1, repeats // 4) / 8 * 1e3
    engine = first.inference_engine
    static = dtype == "int8-static"
    # The arithmetic is counted on the torch engine's modules (int8-static's pass runs past
    # any module: its float32 net's shapes, every layer but the output one in integers).
    on_torch = _build(architecture, "float32" if static else dtype, keyword, "torch")
    on_torch.load_parameters(np.array(first.flat_parameters))
    if engine == "torch":
        # int8-static's torch pass runs past the modules, where no hook times a layer.
        layer_ms = {} if static else _layer_ms(first, obs, repeats)
    else:  # the time is the engine's own
        layer_ms = _onnx_layer_ms(first, obs, repeats)
    return {
        "dtype": dtype,
        "engine": engine,
        "params": first.num_params,
        "bytes_per_forward": weight_bytes,
        "flops_per_forward": sum(_flops(on_torch, obs, static).values()),
        "flops_by_dtype": _flops(on_torch, obs, static),
        "layer_ms": layer_ms,
        "idle_ms": idle,
        "loaded_ms": loaded,
        "loaded_sets": sets,
        "loaded_bytes_cycled": sets * weight_bytes,
        "slowdown": loaded / idle,
        "batch8_ms_per_sample": batch8_ms,
    }


def forward_costs(architecture: str, dtype: str, keyword: str | None, sets: int,
                  l3_bytes: int | None, repeats: int) -> dict:  # fmt: skip
    """Runs the forward micro-benchmark in a fresh pinned process."""
    return in_child(_forward_costs, architecture, dtype, keyword, sets, l3_bytes, repeats)


def _module_pass(module: Any, obs: Any) -> Any:
    """One forward pass through the module's layers, so that their hooks run (a worker's
    act_batch may run the same ops bound into one function, past the modules)."""
    import torch

    with torch.inference_mode():
        return module(torch.from_numpy(obs))


def _layer_ms(policy: Any, obs: Any, repeats: int) -> dict[str, float]:
    """Per-layer ms of one batch-1 forward, timed by hooks on the module's named layers."""
    module = _inference_module(policy)
    layers = {name: getattr(module, name) for name in LAYERS if hasattr(module, name)}
    totals = dict.fromkeys(layers, 0.0)
    started: dict[str, float] = {}
    handles = []

    def before(name: str) -> Any:
        return lambda *_: started.__setitem__(name, time.perf_counter())

    def after(name: str) -> Any:
        def hook(*_: Any) -> None:
            totals[name] += time.perf_counter() - started[name]

        return hook

    for name, layer in layers.items():
        handles.append(layer.register_forward_pre_hook(before(name)))
        handles.append(layer.register_forward_hook(after(name)))
    try:
        for _ in range(5):
            _module_pass(module, obs)
        for name in totals:
            totals[name] = 0.0
        for _ in range(repeats):
            _module_pass(module, obs)
    finally:
        for handle in handles:
            handle.remove()
    return {name: total / repeats * 1e3 for name, total in totals.items()}


def _onnx_layer_ms(policy: Any, obs: Any, repeats: int) -> dict[str, float]:
    """Per-layer ms of one batch-1 forward on onnxruntime, from its per-node profile of the
    policy's own model; "layout" is ONNX Runtime's re-blocking of the convolutions' input
    and output (int8-static: the space-to-depth of its observation, timed here), which
    belongs to no one layer."""
    import json
    import tempfile

    import numpy as np

    from worker.inference.engines.onnx_runtime.atari import AtariWeights
    from worker.inference.engines.onnx_runtime.session import session

    blocks_ms = 0.0
    if policy.inference_dtype == "int8-static":  # its own model, over the observation's blocks
        static = policy.forward
        model = static.onnx_model()
        observation = obs.astype(np.uint8)
        feed = {"observation": static.blocks(observation)}
        started = time.perf_counter()
        for _ in range(repeats):
            static.blocks(observation, out=feed["observation"])
        blocks_ms = (time.perf_counter() - started) / repeats * 1e3
    else:
        model = policy.forward.model(AtariWeights.of(policy.weights, policy.inference_dtype))
        feed = {"observation": obs.astype(np.float32)}
    with tempfile.TemporaryDirectory() as tmp:
        profiled = session(model, f"{tmp}/profile")
        for _ in range(repeats):
            profiled.run(None, feed)
        events = json.loads(Path(profiled.end_profiling()).read_text())
    totals = dict.fromkeys((*LAYERS, "layout"), 0.0)
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        totals[_layer_of(name.removesuffix("_kernel_time"))] += event["dur"] / 1e3
    layer_ms = {layer: total / repeats for layer, total in totals.items()}
    layer_ms["layout"] += blocks_ms
    return layer_ms


def _layer_of(node: str) -> str:
    """The layer an onnxruntime node belongs to (the onnxruntime engine names nodes by their
    output; a fused node keeps its first node's name, or takes it after "fused ")."""
    node = node.removeprefix("fused ")
    for index in (1, 2, 3):
        if node.startswith((f"conv{index}", f"relu{index}")):
            return f"conv{index}"
    if node.startswith("logits"):
        return "out"
    return "fc" if node.startswith(("fc", "features", "hidden")) else "layout"


def _flops(policy: Any, obs: Any, static: bool = False) -> dict[str, int]:
    """Multiply-adds x 2 of one batch-1 forward pass, from the layers' output shapes, by the
    dtype each layer computes in (an int8 dense layer has in_features but no float weight;
    int8-static computes every layer but the output layer in integers, past the modules)."""
    from torch import nn

    flops: dict[str, int] = {}
    output_layer = getattr(_inference_module(policy), "out", None)

    def count(layer: Any, _: Any, output: Any) -> None:
        weight = getattr(layer, "weight", None)
        dtype = str(weight.dtype).removeprefix("torch.") if weight is not None else "int8"
        if static and layer is not output_layer:
            dtype = "int8"
        if isinstance(layer, nn.Conv2d):
            kh, kw = layer.kernel_size
            n = 2 * output.numel() * layer.in_channels * kh * kw // layer.groups
        else:
            n = 2 * output.numel() * layer.in_features
        flops[dtype] = flops.get(dtype, 0) + n

    module = _inference_module(policy)
    handles = [m.register_forward_hook(count) for m in module.modules()
               if isinstance(m, nn.Conv2d | nn.Linear) or hasattr(m, "in_features")]  # fmt: skip
    try:
        _module_pass(module, obs)
    finally:
        for handle in handles:
            handle.remove()
    return flops
