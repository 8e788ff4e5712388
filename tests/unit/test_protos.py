"""The .proto files as shipped: they compile from ``protos/`` alone, and say what every field means.

Issue 18: ``protoc -I protos protos/serving.proto`` failed, because serving.proto imported a path that
only this package's build mapped; and nothing in the API told a caller what to send.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc_tools
import pytest
from google.protobuf import descriptor_pb2

from recsys_rl import contracts

PROTOS = Path(__file__).resolve().parents[2] / "protos"
PROTO_FILES = sorted(p.relative_to(PROTOS).as_posix() for p in PROTOS.rglob("*.proto"))
#: grpc_tools' copy of protoc's well-known types (google/protobuf/*.proto), as a plain protoc has them
WELL_KNOWN = Path(grpc_tools.__file__).parent / "_proto"
#: The contracts a caller reads: every field in them is commented
API_FILES = ["recsys/v1/events.proto", "recsys/v1/serving.proto"]


def compile_protos(files: list[str], out: Path, *flags: str) -> descriptor_pb2.FileDescriptorSet:
    """``files`` compiled with plain ``-I protos``, as any other language's build would; fails the test
    with protoc's message if protoc fails.

    protoc runs in a process of its own: called in the test process, beside the gRPC servers and
    protobuf pools other tests left loaded, grpc_tools' protoc crashed the whole session (a segfault).
    """
    descriptors = out / "descriptors.pb"
    argv = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"-I{WELL_KNOWN}",
        f"--python_out={out}",
    ]
    argv += [f"--descriptor_set_out={descriptors}", "--include_imports", *flags, *files]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"protoc -I protos {' '.join(files)} failed: {done.stderr}"
    return descriptor_pb2.FileDescriptorSet.FromString(descriptors.read_bytes())


def test_the_layout_holds_the_api_and_the_example_twin():
    assert {"recsys/v1/events.proto", "recsys/v1/serving.proto", "recsys/tfexample/tf_example.proto"} <= set(
        PROTO_FILES
    )


@pytest.mark.parametrize("name", PROTO_FILES)
def test_each_proto_compiles_on_its_own_from_protos(name, tmp_path):
    compiled = compile_protos([name], tmp_path)
    assert compiled.file[-1].name == name


def test_each_proto_sits_at_the_path_of_its_package(tmp_path):
    for file in compile_protos(PROTO_FILES, tmp_path).file:
        assert Path(file.name).parent.as_posix() == file.package.replace(".", "/"), file.name


def test_the_installed_stubs_carry_the_names_other_languages_use():
    """Reflection (grpcurl) serves the Python stubs' descriptors: their names are the protos' paths."""
    assert contracts.serving_pb2.DESCRIPTOR.name == "recsys/v1/serving.proto"
    assert contracts.serving_pb2.DESCRIPTOR.dependencies[0].name == "recsys/v1/events.proto"
    assert contracts.tf_example_pb2.DESCRIPTOR.name == "recsys/tfexample/tf_example.proto"
    assert contracts.RankRequest.__module__ == "recsys_rl.proto.serving_pb2"  # pickles by this name


def test_every_field_of_the_api_is_commented(tmp_path):
    compiled = compile_protos(API_FILES, tmp_path, "--include_source_info")
    uncommented = []
    for file in compiled.file:
        if file.name not in API_FILES:
            continue
        commented = {
            tuple(location.path)
            for location in file.source_code_info.location
            if location.leading_comments.strip() or location.trailing_comments.strip()
        }
        # source paths: 4 = FileDescriptorProto.message_type, 2 = DescriptorProto.field
        for m, message in enumerate(file.message_type):
            for f, field in enumerate(message.field):
                if (4, m, 2, f) not in commented:
                    uncommented.append(f"{file.name}: {message.name}.{field.name}")
    assert uncommented == []
