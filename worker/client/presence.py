"""The presence thread: an Attach call held open while the worker runs, so the master knows at
once when this worker is gone."""

from __future__ import annotations

import threading
from typing import Any

import grpc

from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import open_channel
from worker.client.held import HeldTasks
from worker.client.wire import FIRST_BACKOFF_S, back_off

_FINAL = {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED,
          grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
          grpc.StatusCode.RESOURCE_EXHAUSTED}  # fmt: skip
"""Attach answers that retrying cannot change: an older master, a bad token or id, or a master
watching as many workers as it can (the leases then lapse, as they always did)."""


class Presence:
    """Holds an Attach call open while the worker runs: when this process is killed, or its
    host or network lost, the call ends and the master hands this worker's tasks to others at
    once instead of when their leases lapse. Reconnects with backoff; a master without Attach
    (an older one) leaves the leases to lapse, as before."""

    def __init__(
        self,
        address: str,
        worker_id: str,
        held: HeldTasks,
        stop: threading.Event,
        token: str | None = None,
        root_certificates: bytes | None = None,
    ) -> None:
        self.address = address
        self.worker_id = worker_id
        self._held = held
        self._stop = stop
        self._token = token  # private and out of any repr: it must never reach a log line
        self._root_certificates = root_certificates
        self._call: Any = None
        """The open Attach call, cancelled (cancel()) once the tasks are handed back."""
        self._lock = threading.Lock()

    def run(self) -> None:
        """The thread's body: returns on stop, on a final answer, or when the run completes."""
        channel = open_channel(self.address, self._token, self._root_certificates)
        stub = pb_grpc.EvolutionStub(channel)
        request = pb.AttachRequest(protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                                   worker_id=self.worker_id)  # fmt: skip
        held = self._held
        backoff = FIRST_BACKOFF_S
        try:
            while not self._stop.is_set():
                call = stub.Attach(request)
                with self._lock:
                    self._call = call
                    if self._stop.is_set():
                        call.cancel()
                try:
                    for update in call:
                        backoff = FIRST_BACKOFF_S
                        if update.run_complete:
                            with held.wake:
                                held.run_complete = True
                                held.wake.notify_all()
                except grpc.RpcError as error:
                    if self._stop.is_set() or error.code() in _FINAL:
                        return
                with held.wake:
                    if held.run_complete:
                        return
                backoff = back_off(self._stop, backoff)
        finally:
            channel.close()

    def cancel(self) -> None:
        """Ends the open call: the master then takes this worker as gone."""
        with self._lock:
            if self._call is not None:
                self._call.cancel()
