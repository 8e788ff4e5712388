"""A Node.js caller ranks against a real server with the protos exactly as shipped.

Issue 18 found that ``protos/`` did not compile outside this package's own build. Here the protos are
loaded the way any Node service would load them, ``@grpc/proto-loader`` with ``includeDirs: ['protos']``
and ``keepCase``, and a real ``Rank`` call goes over ``@grpc/grpc-js`` (``tests/node/rank.js``; its
packages are pinned by ``tests/node/package-lock.json`` and installed by ``make test``). No registry is
given, so the deterministic fallback policy answers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from recsys_rl import contracts
from recsys_rl.fusion import FEED_ACTION_NAMES, PREDICTION_SCALE
from recsys_rl.serving.server import RunningServer, start_server
from recsys_rl.serving.settings import ServeConfig

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "tests" / "node"
PAGE_SIZE = 5


@pytest.fixture(scope="module")
def node() -> str:
    """The node executable, with the pinned packages installed; a failure, never a skip, without them."""
    found = shutil.which("node")
    if found is None:
        pytest.fail("node is not on PATH: install Node.js (18 or newer) and npm, then run `make test`")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail("tests/node/node_modules is missing: run `make node-deps` (npm ci --prefix tests/node)")
    return found


@pytest.fixture
def server() -> Iterator[RunningServer]:
    running = start_server(ServeConfig(port=0))
    yield running
    running.stop(1.0)


def rank_json(item_type: str = "ITEM_TYPE_VIDEO") -> dict:
    """A Rank request as a Node caller writes it: field names as in the .proto, enums by name."""
    rng = np.random.default_rng(11)
    predictions = PREDICTION_SCALE * rng.lognormal(0.0, 0.5, (12, len(PREDICTION_SCALE)))
    return {
        "schema_version": contracts.SERVING_SCHEMA_VERSION,
        "request_id": "node-req-1",
        "user_id": "node-user-1",
        "context": {"event_time_ms": "1700000000000", "page_index": 2, "session_id": "node-s1"},
        "candidates": [
            {"item_id": f"v{j}", "author_id": f"a{j}", "item_type": item_type, "predictions": row}
            for j, row in enumerate(predictions.tolist())
        ],
        "prediction_names": list(FEED_ACTION_NAMES),
        "page_size": PAGE_SIZE,
    }


def run_node(node: str, port: int, request: dict) -> subprocess.CompletedProcess[str]:
    argv = [node, "tests/node/rank.js", f"127.0.0.1:{port}", json.dumps(request)]
    # run from the repository root: the script's includeDirs is the relative 'protos', as a caller's is
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_node_client_ranks_and_gets_the_python_clients_answer(node: str, server: RunningServer) -> None:
    request = rank_json()
    result = run_node(node, server.port, request)
    assert result.returncode == 0, f"node failed:\n{result.stdout}\n{result.stderr}"
    answer = json.loads(result.stdout)

    sent = [c["item_id"] for c in request["candidates"]]
    assert len(answer["item_ids"]) == PAGE_SIZE
    assert len(set(answer["item_ids"])) == PAGE_SIZE and set(answer["item_ids"]) <= set(sent)
    assert answer["request_id"] == request["request_id"]
    assert answer["routing_arm"] == "ROUTING_ARM_FALLBACK"
    assert answer["policy_version"]
    assert answer["scores"] == sorted(answer["scores"], reverse=True)

    # The same request from Python: the answer is seeded by the request id, so it must be the same one,
    # which it is only if Node encoded every candidate and prediction as Python does.
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = contracts.serving_pb2_grpc.RankingServiceStub(channel)
        python = stub.Rank(json_format.ParseDict(request, contracts.RankRequest()), timeout=30)
    assert answer["item_ids"] == list(python.item_ids)
    np.testing.assert_allclose(answer["scores"], python.scores, rtol=1e-6)
    assert answer["policy_version"] == python.policy_version


def test_a_node_client_sending_a_live_item_to_rank_is_told_which_field(
    node: str, server: RunningServer
) -> None:
    result = run_node(node, server.port, rank_json(item_type="ITEM_TYPE_LIVE"))
    assert result.returncode == 1
    assert "INVALID_ARGUMENT" in result.stderr
    assert "candidates[0].item_type should be ITEM_TYPE_VIDEO, but is ITEM_TYPE_LIVE" in result.stderr
