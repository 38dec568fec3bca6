"""A stand-in for a broken worker host (an out-of-memory GPU, a broken install): it holds the
token, leases tasks like a worker and answers every one with an error, until the run is over.

    NEURO_TOKEN=... python -m tests.support.failing_worker --master HOST:PORT --worker-id ID

Its count of tasks failed is printed at the end, one line: `failed N`.
"""

from __future__ import annotations

import argparse
import os
import time

import grpc

from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import METADATA_KEY

ERROR = "RuntimeError: CUDA out of memory"
CALL_S = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--max-tasks", type=int, default=4)
    parser.add_argument("--give-up-after", type=float, default=120.0, help="seconds, at most")
    args = parser.parse_args()
    metadata = ((METADATA_KEY, f"Bearer {os.environ['NEURO_TOKEN']}"),)
    failed = 0
    deadline = time.monotonic() + args.give_up_after
    with grpc.insecure_channel(args.master) as channel:
        stub = pb_grpc.EvolutionStub(channel)
        common = {"protocol_version": pb.PROTOCOL_VERSION_CURRENT, "worker_id": args.worker_id}
        while time.monotonic() < deadline:
            lease = pb.LeaseRequest(max_tasks=args.max_tasks, **common)
            try:
                response = stub.Lease(lease, timeout=CALL_S, metadata=metadata)
            except grpc.RpcError:
                time.sleep(0.2)  # the master is not up yet, or gone
                continue
            if response.run_complete:
                break
            if not response.tasks:
                time.sleep(response.retry_after_ms / 1000)
                continue
            results = [pb.TaskResult(task_id=task.task_id, run_id=task.run_id, error=ERROR)
                       for task in response.tasks]  # fmt: skip
            acks = stub.Report(pb.ReportRequest(results=results, **common), timeout=CALL_S,
                               metadata=metadata).acks  # fmt: skip
            failed += sum(ack.disposition == pb.RESULT_DISPOSITION_ACCEPTED for ack in acks)
    print(f"failed {failed}", flush=True)


if __name__ == "__main__":
    main()
