# recsys-rl: every command a user or CI needs, each installing what it uses first.
#   make demo         the closed loop on the embedded default: simulate, pipeline, serve, pipeline again
#   make test         unit + integration tests (starts real Apache Kafka and Redis on loopback; needs
#                     Node.js and npm for the Node gRPC client test, Go for Beam's boot program; installs
#                     Debian's headless Chromium)
#   make lint         ruff; rustfmt and clippy on rankwire/
#   make bench        full benchmarks -> bench/results/*.json
#   make bench-quick  the same, small sizes (CI)
#   make mutation     mutation scores of the core modules -> bench/results/mutation.json
#                     (MODULES="recsys_rl/ope/gate.py ..." for a subset; by hand, not in CI)

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_DIR := tests/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
KAFKA_VERSION := 4.1.1
KAFKA_LIBS ?= $(HOME)/.cache/recsys-rl/kafka-$(KAFKA_VERSION)/libs
export RECSYS_RL_KAFKA_LIBS := $(KAFKA_LIBS)
BEAM_FLINK_VERSION := 2.62.0
FLINK_LIBS ?= $(HOME)/.cache/recsys-rl/beam-flink-1.19-$(BEAM_FLINK_VERSION)/libs
export RECSYS_RL_FLINK_LIBS := $(FLINK_LIBS)
BEAM_VERSION := $(shell sed -n 's/^apache-beam==//p' requirements.lock)
BEAM_BOOT ?= $(HOME)/.cache/recsys-rl/beam-boot-$(BEAM_VERSION)/boot
export RECSYS_RL_BEAM_BOOT := $(BEAM_BOOT)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install demo test lint bench bench-quick mutation kafka-jars flink-jars beam-boot redis-server node-deps chromium lock clean

install: $(STAMP)

# The lock file pins the whole resolved set; the project itself goes in editable, without build
# isolation, so that its build step (protobuf stub generation) uses the pinned grpcio-tools. The server's
# Rank candidate reader (rankwire/, Rust) is built by the maturin its pyproject.toml pins, in pip's
# isolated build environment, with the crates its Cargo.lock pins (needs cargo).
$(STAMP): setup.py pyproject.toml requirements.lock $(shell find protos -name '*.proto') \
		rankwire/Cargo.toml rankwire/Cargo.lock rankwire/pyproject.toml $(wildcard rankwire/src/*.rs)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check pip==26.3 setuptools==84.2.1 wheel==0.48.0
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check ./rankwire
	$(BIN)/pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps -e .
	$(BIN)/pip check
	touch $@

demo: install
	$(BIN)/recsys-rl demo --out demo-output

# Two worker processes, each taking whole test files (pytest-xdist's loadfile, so a module's fixtures are
# built once): most integration tests wait on brokers, JVMs and subprocesses, which the other worker fills
# (1,633 tests: 20 min against 29-31 min in one process on this 2-core machine). Each worker starts the
# services its files ask for. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: install kafka-jars flink-jars beam-boot redis-server node-deps chromium
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cargo fmt --check --manifest-path rankwire/Cargo.toml
	cargo clippy --quiet --locked --release --manifest-path rankwire/Cargo.toml -- -D warnings

bench: install
	$(BIN)/python bench/simulator.py --full --out bench/results/simulator.json
	$(BIN)/python bench/pipeline.py --full --out bench/results/pipeline.json
	$(BIN)/python bench/training.py --full --out bench/results/training.json
	$(BIN)/python bench/policy_quality.py --full --out bench/results/policy_quality.json --docs docs/policy_quality.md
	$(BIN)/python bench/feed_ceiling.py --full --out bench/results/feed_ceiling.json
	$(BIN)/python bench/lookahead_ceiling.py --full --out bench/results/lookahead_ceiling.json
	$(BIN)/python bench/stage_one_actors.py --full --out bench/results/stage_one_actors.json
	$(BIN)/python bench/allocation_quality.py --full --out bench/results/allocation_quality.json --docs docs/allocation_quality.md
	$(BIN)/python bench/user_author.py --full --out bench/results/user_author.json --docs docs/user_author.md
	$(BIN)/python bench/follow_ceiling.py --full --out bench/results/follow_ceiling.json
	$(BIN)/python bench/ope.py --full --out bench/results/ope.json
	$(BIN)/python bench/serving.py --full --out bench/results/serving.json
	$(BIN)/python bench/feature_reads.py --full --out bench/results/feature_reads.json
	$(BIN)/python bench/user_author_serving.py --full --out bench/results/user_author_serving.json

bench-quick: install
	$(BIN)/python bench/simulator.py --quick --out bench/results/simulator.json
	$(BIN)/python bench/pipeline.py --quick --out bench/results/pipeline.json
	$(BIN)/python bench/training.py --quick --out bench/results/training.json
	$(BIN)/python bench/policy_quality.py --quick --out bench/results/policy_quality.quick.json
	$(BIN)/python bench/feed_ceiling.py --quick --out bench/results/feed_ceiling.quick.json
	$(BIN)/python bench/lookahead_ceiling.py --quick --out bench/results/lookahead_ceiling.quick.json
	$(BIN)/python bench/allocation_quality.py --quick --out bench/results/allocation_quality.quick.json
	$(BIN)/python bench/user_author.py --quick --out bench/results/user_author.quick.json
	$(BIN)/python bench/follow_ceiling.py --quick --out bench/results/follow_ceiling.quick.json
	$(BIN)/python bench/ope.py --quick --out bench/results/ope.json
	$(BIN)/python bench/serving.py --quick --out bench/results/serving.json
	$(BIN)/python bench/feature_reads.py --quick --out bench/results/feature_reads.json
	$(BIN)/python bench/user_author_serving.py --quick --out bench/results/user_author_serving.json

# mutmut on each module of [tool.mutation.modules] in pyproject.toml, against its listed unit tests only
# (bench/mutation.py); tens of seconds to tens of minutes per module on two cores.
mutation: install
	$(BIN)/python bench/mutation.py --out bench/results/mutation.json $(if $(MODULES),--modules $(MODULES)) \
		$(if $(FAIL_UNDER),--fail-under $(FAIL_UNDER))

# Apache Kafka for the integration tests: jars from Maven Central, cached outside the checkout and shared
# by every checkout on the machine (fetched again only when the pom's content changes: tests/fetch_jars.sh).
kafka-jars:
	tests/fetch_jars.sh tests/kafka/pom.xml $(KAFKA_LIBS)

# Beam's Flink job server (Flink 1.19 in its JVM) for the Flink runner test: jars from Maven Central,
# cached outside the checkout. Maven Central has no 2.77 job server and 2.62.0 is the newest that
# resolves, so the pinned 2.77 Python SDK submits to it (tests/flink/pom.xml, README.md "Other runners").
flink-jars:
	tests/fetch_jars.sh tests/flink/pom.xml $(FLINK_LIBS)

# Beam's SDK worker entrypoint (boot) of the pinned Beam release, which the Flink test's PROCESS environment
# runs to install the project on its workers from --setup_file: built from the Beam Go module (Go module
# proxy, about 40 s the first time), cached outside the checkout under the Beam version, so it is built
# once per version and machine.
beam-boot: $(BEAM_BOOT)

$(BEAM_BOOT):
	GOBIN=$(dir $(BEAM_BOOT)) go install github.com/apache/beam/sdks/v2/python/container@v$(BEAM_VERSION)
	mv $(dir $(BEAM_BOOT))container $@

# Debian's redis-server; the tests start their own instance on a free loopback port.
redis-server:
	@command -v redis-server >/dev/null || { \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends redis-server; }

# Debian's headless Chromium, which tests/integration/test_report_browser.py loads the OPE report in (through
# playwright, launched on this binary: playwright's own browser download is not used).
chromium:
	@command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null || { \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium-headless-shell; }

# The Node.js gRPC client of tests/integration/test_node_client.py: @grpc/grpc-js and @grpc/proto-loader
# at the versions package-lock.json pins, installed again only when the lock file changes; no package
# needs an install script (protobufjs's only warns about how dependents pin it), so none runs.
node-deps: $(NODE_STAMP)

$(NODE_STAMP): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	npm ci --prefix $(NODE_DIR) --no-audit --no-fund --ignore-scripts
	touch $@

# Re-resolve the pinned sets after changing install_requires in setup.py: requirements.lock, the whole
# development set, and requirements-runtime.lock, what 'pip install .' alone installs (servers, the
# Dockerfile). The runtime set is installed into a second fresh venv, constrained by requirements.lock,
# and frozen: only pip's resolver knows what the runtime requirements pull in (extras such as feast[redis],
# markers), and the constraint keeps every runtime pin equal to the development one the tests ran against
# (tests/unit/test_locks.py checks both).
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet pip==26.3 setuptools==84.2.1 wheel==0.48.0 grpcio-tools==1.81.*
	.lock-venv/bin/pip install --quiet --no-build-isolation '.[dev]'
	{ echo "# Resolved, pinned dependency set of recsys-rl (Python 3.11, linux x86_64)."; \
	  echo "# Regenerate with 'make lock' after changing install_requires in setup.py."; \
	  .lock-venv/bin/pip freeze --exclude-editable | grep -v '^recsys-rl'; } > requirements.lock
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet pip==26.3 setuptools==84.2.1 wheel==0.48.0
	.lock-venv/bin/pip install --quiet -c requirements.lock grpcio-tools
	.lock-venv/bin/pip install --quiet --no-build-isolation -c requirements.lock .
	{ echo "# Runtime-only pinned dependency set of recsys-rl (Python 3.11, linux x86_64): what 'pip install .' installs."; \
	  echo "# Its pins equal requirements.lock's; regenerate both with 'make lock' after changing install_requires in setup.py."; \
	  .lock-venv/bin/pip freeze | grep -v '^recsys-rl'; } > requirements-runtime.lock
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) build *.egg-info recsys_rl/proto/*_pb2*.py recsys_rl/proto/*_pb2*.pyi .pytest_cache $(NODE_DIR)/node_modules
