"""THE harness for a live master in tests: on loopback, started with a config, always stopped.

Every test that needs an in-process master serving gRPC uses `live_master` (re-exported by
tests/conftest.py) rather than calling master.run.start.start_master itself:

    async with live_master(tiny_cartpole(), tmp_path / "run") as live:
        worker = spawn_worker(live.port, "w1")
        records = await live.training

`train=False` leaves training to the test: patch the trainer first, or capture its state,
then `live.start_training()` (still cancelled on exit) or await `live.trainer.run()` directly.
Tests of the full `run_master`/CLI path start that path themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from master.config import RunConfig
from master.run.start import Master, start_master
from master.run.trainer import Trainer
from neuro.v1 import evolution_pb2_grpc as pb_grpc


@dataclass
class LiveMaster:
    """A master serving on loopback, its run dir and (when started) its training task."""

    master: Master
    run_dir: Path
    training: asyncio.Future | None = None
    _channels: list[grpc.aio.Channel] = field(default_factory=list)

    @property
    def port(self) -> int:
        """The port the master bound."""
        return self.master.port

    @property
    def address(self) -> str:
        """host:port of the master, on loopback."""
        return f"127.0.0.1:{self.master.port}"

    @property
    def trainer(self) -> Trainer:
        """The trainer the master serves."""
        return self.master.trainer

    def start_training(self) -> asyncio.Future:
        """Starts the trainer's run (with train=False); cancelled on exit like the default one."""
        assert self.training is None, "training already started"
        self.training = asyncio.ensure_future(self.master.trainer.run())
        return self.training

    def channel(
        self,
        options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | None = None,
    ) -> grpc.aio.Channel:
        """A new grpc.aio channel to the master (TLS with `credentials`), closed with the master."""
        if credentials is None:
            channel = grpc.aio.insecure_channel(self.address, options=list(options))
        else:
            channel = grpc.aio.secure_channel(self.address, credentials, options=list(options))
        self._channels.append(channel)
        return channel

    def stub(self, options: Sequence[tuple[str, Any]] = ()) -> pb_grpc.EvolutionStub:
        """An Evolution stub on a new plain channel to the master."""
        return pb_grpc.EvolutionStub(self.channel(options))


@contextlib.asynccontextmanager
async def live_master(
    config: RunConfig,
    run_dir: Path,
    *,
    train: bool = True,
    port: int = 0,
    token: str | None = None,
    tls: tuple[bytes, bytes] | None = None,
    resume: dict[str, Any] | None = None,
    checkpoint_seconds: float = 30.0,
    options: tuple[tuple[str, Any], ...] = (),
) -> AsyncIterator[LiveMaster]:
    """Starts a master on 127.0.0.1 (port 0: a free one), training unless `train` is False.

    On exit the training task is cancelled, the channels handed out are closed and the master
    stops, whatever happened inside.
    """
    master = await start_master(config, run_dir, port=port, out=None, resume=resume,
                                checkpoint_seconds=checkpoint_seconds, token=token,
                                tls=tls, options=options)  # fmt: skip
    live = LiveMaster(master, Path(run_dir))
    if train:
        live.start_training()
    try:
        yield live
    finally:
        if live.training is not None:
            live.training.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live.training
        for channel in live._channels:
            await channel.close()
        await master.stop(0)
