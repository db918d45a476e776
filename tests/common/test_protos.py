"""The committed gRPC stubs are exactly what protos/ generates."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO = "common/rlfleet/v1/actor_service.proto"
GENERATED = ["actor_service_pb2.py", "actor_service_pb2.pyi", "actor_service_pb2_grpc.py"]


def test_stubs_match_a_fresh_generation(tmp_path: pathlib.Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "protos" / PROTO),
        ],
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "common/rlfleet/v1" / name).read_text()
        committed = (ROOT / "common/rlfleet/v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make protos` and commit the result"


def test_stubs_import_and_name_the_versioned_service() -> None:
    from common.rlfleet.v1 import actor_service_pb2, actor_service_pb2_grpc

    service = actor_service_pb2.DESCRIPTOR.services_by_name["ActorService"]
    assert service.full_name == "rlfleet.v1.ActorService"
    assert hasattr(actor_service_pb2_grpc, "ActorServiceStub")
