"""The committed gRPC stubs are exactly what grpcio-tools generates from proto/."""

from __future__ import annotations

from pathlib import Path

from grpc_tools import protoc

from tests.support.processes import REPO

GENERATED = ("evolution_pb2.py", "evolution_pb2.pyi", "evolution_pb2_grpc.py")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{REPO / 'proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(REPO / "proto/neuro/v1/evolution.proto"),
        ]
    )
    assert code == 0
    for name in GENERATED:
        fresh = (tmp_path / "neuro/v1" / name).read_text()
        committed = (REPO / "neuro/v1" / name).read_text()
        assert committed == fresh, f"neuro/v1/{name} is stale: run `make stubs`"


def test_the_service_is_versioned() -> None:
    from neuro.v1 import evolution_pb2 as pb

    assert pb.DESCRIPTOR.package == "neuro.v1"
    assert pb.PROTOCOL_VERSION_CURRENT == 1
    assert set(pb.DESCRIPTOR.services_by_name["Evolution"].methods_by_name) == {
        "Lease", "Report", "Heartbeat", "Release", "Status", "FetchParameters", "Attach"
    }  # fmt: skip
