"""Builds the master and worker images with the local Docker engine, as `make images` and the
container test do; what a machine without registry access needs comes in as arguments.

Settings (the Makefile's variables, DEVELOPERS.md):
  NEURO_IMAGE_TAG           the images' tag (default 0.1.0: neuro-master:0.1.0, neuro-worker:0.1.0)
  NEURO_DOCKER_BUILD_FLAGS  extra `docker build` flags for both, e.g. "--network host
                            --build-arg BASE_IMAGE=local/python:3.11-slim-bookworm"
  NEURO_TORCH_WHEELS        a local directory holding the torch wheel: served over HTTP on
                            loopback for the worker's build (which must then share the host's
                            network, --network host), instead of PyTorch's wheel index
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROLES = ("master", "worker")
DEFAULT_TAG = "0.1.0"


class BuildError(RuntimeError):
    """A `docker build` failed; the message holds the command and the end of its output."""


@dataclass(frozen=True)
class BuildSettings:
    """How to build both images on this machine."""

    tag: str = DEFAULT_TAG
    flags: list[str] = field(default_factory=list)
    """Extra `docker build` flags, for both images."""
    torch_wheels: Path | None = None
    """A local wheel directory that holds the worker's torch, served to its build."""

    @classmethod
    def from_env(cls, tag: str | None = None) -> BuildSettings:
        wheels = os.environ.get("NEURO_TORCH_WHEELS", "").strip()
        return cls(
            tag=tag or os.environ.get("NEURO_IMAGE_TAG", "").strip() or DEFAULT_TAG,
            flags=shlex.split(os.environ.get("NEURO_DOCKER_BUILD_FLAGS", "")),
            torch_wheels=Path(wheels) if wheels else None,
        )

    def image(self, role: str) -> str:
        return f"neuro-{role}:{self.tag}"


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """An HTTP server on loopback listing `directory` (pip's --find-links reads the listing)."""
    if not directory.is_dir():
        raise BuildError(f"NEURO_TORCH_WHEELS={directory}: not a directory")
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build_command(settings: BuildSettings, role: str, wheels_url: str | None) -> list[str]:
    """The `docker build` of one image from the repository root."""
    command = ["docker", "build", "--file", f"Dockerfile.{role}", "--tag", settings.image(role)]
    command += settings.flags
    if role == "worker" and wheels_url is not None:
        # Torch from the served directory through pip's own sources, not PyTorch's index;
        # the rest of the worker's packages from pip's index as usual.
        command += ["--build-arg", "TORCH_INDEX_URL="]
        command += ["--build-arg", f"PIP_FIND_LINKS={wheels_url}"]
    return [*command, "."]


def build_images(
    settings: BuildSettings, timeout_s: float = 1800, log: Path | None = None
) -> dict[str, float]:
    """Builds both images; returns each build's seconds. Output goes to `log` (or stderr)."""
    seconds = {}
    with contextlib.ExitStack() as stack:
        wheels_url = None
        if settings.torch_wheels is not None:
            wheels_url = stack.enter_context(serve_directory(settings.torch_wheels))
        sink = stack.enter_context(log.open("ab")) if log is not None else None
        for role in ROLES:
            command = build_command(settings, role, wheels_url)
            started = time.monotonic()
            done = subprocess.run(command, cwd=REPO, stdout=sink or sys.stderr,
                                  stderr=subprocess.STDOUT, timeout=timeout_s)  # fmt: skip
            seconds[role] = time.monotonic() - started
            if done.returncode != 0:
                tail = log.read_text(errors="replace")[-3000:] if log is not None else ""
                raise BuildError(
                    f"{shlex.join(command)} exited {done.returncode}; a machine without "
                    f"registry access needs build arguments (DEVELOPERS.md)\n{tail}"
                )
    return seconds


def image_size(image: str) -> int:
    """The image's size in bytes, as the engine reports it."""
    done = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", image],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return int(done.stdout.strip())


def main() -> int:
    """`make images`: builds both, then prints each image's name and size."""
    settings = BuildSettings.from_env()
    try:
        seconds = build_images(settings)
    except BuildError as error:
        print(error, file=sys.stderr)
        return 1
    for role in ROLES:
        image = settings.image(role)
        print(f"{image}: {image_size(image) / 1e6:,.0f} MB, built in {seconds[role]:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
