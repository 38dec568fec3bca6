"""The images' build args: the base image, pip's sources for the builder only, and where the
worker's torch comes from; the defaults are a plain `docker build` (no Docker engine needed:
the torch RUN itself runs here, under sh, with a stand-in pip)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.test_dockerfiles import (
    CPU_INDEX,
    DOCKERFILES,
    build_values,
    expand,
    image_env,
    lineage,
    parse,
    stage_args,
    torch_install,
)

BASE = "python:3.11-slim-bookworm"
PIP_SETTINGS = ("PIP_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST")


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_every_stage_starts_from_the_base_image_build_arg(role: str) -> None:
    assert lineage(role)[1] == BASE
    mirror = "registry.example:5000/python:3.11-slim-bookworm"
    assert lineage(role, BASE_IMAGE=mirror)[1] == mirror
    # Every FROM names an earlier stage or the build arg: no stage pins an image of its own.
    stages = parse(DOCKERFILES[role])
    values = build_values(role, {})
    named = {s[0].args.split()[-1] for s in stages if len(s[0].args.split()) == 3}
    for stage in stages:
        image = stage[0].args.split()[0]
        assert image == "${BASE_IMAGE}" or expand(image, values) in named, (
            f"Dockerfile.{role}:{stage[0].line}: FROM {image}")  # fmt: skip


@pytest.mark.parametrize("role", sorted(DOCKERFILES))
def test_pip_settings_reach_the_builder_and_never_the_image(role: str) -> None:
    """A PyPI mirror (PIP_INDEX_URL, ...) is a build arg of the stage that runs pip, declared
    without a value so pip's own default stands when none is given, and not one the final
    stage sees or keeps in its environment."""
    builder, final = parse(DOCKERFILES[role])[0], parse(DOCKERFILES[role])[-1]
    declared = {ins.args for ins in builder if ins.keyword == "ARG"}
    assert set(PIP_SETTINGS) <= declared, declared
    final_args = {ins.args.partition("=")[0] for ins in final if ins.keyword == "ARG"}
    assert not final_args & set(PIP_SETTINGS), final_args
    for setting in PIP_SETTINGS:
        assert setting not in image_env(role, **{setting: "https://mirror.example/simple"})


def run_torch_install(tmp_path: Path, **build_args: str) -> dict:
    """Runs the worker's torch RUN as Docker would (sh -c, the stage's args in the environment)
    with `python` and `pip` standing in: what pip was asked for, and with which sources."""
    run, _, seen = torch_install(**build_args)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    record = tmp_path / "pip.json"
    (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "pip").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('PIP_')}\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': env}}, open({str(record)!r}, 'w'))\n"
    )
    for tool in ("python", "pip"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env |= {name: value for name, value in seen.items() if value is not None}
    done = subprocess.run(["sh", "-c", run.args], env=env, capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(record.read_text())


def test_torch_comes_from_pytorchs_cpu_index_by_default(tmp_path: Path) -> None:
    asked = run_torch_install(tmp_path)
    assert asked["env"]["PIP_INDEX_URL"] == CPU_INDEX
    assert asked["argv"][-1] == "torch==2.13.0+cpu", asked


def test_torch_from_a_mirror_of_pytorchs_index(tmp_path: Path) -> None:
    mirror = "https://mirror.example/pytorch/whl/cpu"
    asked = run_torch_install(tmp_path, TORCH_INDEX_URL=mirror)
    assert asked["env"]["PIP_INDEX_URL"] == mirror


def test_torch_from_pips_own_sources_when_its_index_is_empty(tmp_path: Path) -> None:
    """TORCH_INDEX_URL= (empty): torch from pip's index (its default, or PIP_INDEX_URL) and
    PIP_FIND_LINKS, e.g. a local wheel directory served over HTTP (tests/containers)."""
    asked = run_torch_install(tmp_path, TORCH_INDEX_URL="", PIP_FIND_LINKS="http://127.0.0.1:9/")
    assert "PIP_INDEX_URL" not in asked["env"], asked
    assert asked["env"]["PIP_FIND_LINKS"] == "http://127.0.0.1:9/"
    assert asked["argv"][-1] == "torch==2.13.0+cpu", "still the CPU build, never PyPI's"
    mirror = "https://pypi-mirror.example/simple"
    asked = run_torch_install(tmp_path / "m", TORCH_INDEX_URL="", PIP_INDEX_URL=mirror)
    assert asked["env"]["PIP_INDEX_URL"] == mirror


def test_the_builder_sees_the_build_args_it_is_given() -> None:
    """Every build arg the Makefile's and the test's builds pass is one the Dockerfile takes."""
    for name in ("BASE_IMAGE", "TORCH_INDEX", "TORCH_INDEX_URL", "EXTRAS", *PIP_SETTINGS):
        values = build_values("worker", {name: "x"})
        builder = parse(DOCKERFILES["worker"])[0]
        last_run = [ins for ins in builder if ins.keyword == "RUN"][-1]
        if name != "BASE_IMAGE":  # used in FROM lines only
            assert stage_args(builder, values, last_run)[name] == "x", name
    for name in ("BASE_IMAGE", *PIP_SETTINGS):
        build_values("master", {name: "x"})
