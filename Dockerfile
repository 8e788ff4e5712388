# recsys-rl serve in a container: the runtime lock's pins and the project's wheel, nothing of the
# development set. README.md, "Packaging", has the build and run commands.
#
# PYTHON_IMAGE lets a team pin the base image by digest (python:3.11-slim@sha256:...) for repeatable builds.
ARG PYTHON_IMAGE=python:3.11-slim
# The Rust toolchain that builds the Rank candidate reader (rankwire/), copied into the builder stage
ARG RUST_IMAGE=rust:1.95-slim
FROM ${RUST_IMAGE} AS rust

# The wheel is built apart, so that the image carries neither the checkout nor the build's leftovers.
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY requirements-runtime.lock ./
# The build tools at the Makefile's versions; grpcio-tools at the lock's pin generates the protobuf stubs
# while the wheel builds (setup.py), hence --no-build-isolation, as in make install.
RUN pip install pip==26.3 setuptools==84.2.1 wheel==0.48.0 \
    && pip install -c requirements-runtime.lock grpcio-tools
# rankwire/ is Rust: cargo from the Rust image, and a C linker for the extension module
COPY --from=rust /usr/local/cargo /usr/local/cargo
COPY --from=rust /usr/local/rustup /usr/local/rustup
ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup PATH=/usr/local/cargo/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY . .
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && pip wheel --no-deps --wheel-dir /wheels ./rankwire

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1
# pip freeze leaves setuptools and wheel out of the lock, but tensorflow and astunparse require them:
# the Makefile's versions. --no-deps installs exactly the lock; pip check then proves it complete.
COPY requirements-runtime.lock /tmp/
RUN pip install pip==26.3 setuptools==84.2.1 wheel==0.48.0 \
    && pip install --no-deps -r /tmp/requirements-runtime.lock \
    && rm /tmp/requirements-runtime.lock
COPY --from=builder /wheels/ /tmp/wheels/
RUN pip install --no-deps /tmp/wheels/*.whl && pip check && rm -rf /tmp/wheels

# The server needs no privileges; a home directory takes the libraries' caches (TensorFlow, matplotlib).
# The user is named by number, so that Kubernetes' runAsNonRoot can verify it.
RUN useradd --create-home --uid 10001 --user-group recsys
USER 10001
WORKDIR /home/recsys

# gRPC (serve --port) and Prometheus /metrics with the JSON /status (serve --metrics-port).
EXPOSE 50051 9100
ENTRYPOINT ["recsys-rl"]
# /registry is not created here: without a mounted registry, serve refuses to start (exit 2) instead of
# answering with the fallback policies. Listening on 0.0.0.0, since serve's default is loopback only.
# Kafka comes from RECSYS_RL_BOOTSTRAP_SERVERS (docker run -e); without it decisions are not logged.
CMD ["serve", "--host", "0.0.0.0", "--port", "50051", "--registry", "/registry", "--metrics-port", "9100"]
