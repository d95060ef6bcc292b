# syntax=docker/dockerfile:1
# The KafScale broker image:  docker build -t kafscale:0.1.0 .
# Run:  docker run --shm-size 1g -p 9092:9092 -p 9093:9093 kafscale:0.1.0
# (/dev/shm holds the partition buffers: docker's default of 64 MiB is below KAFSCALE_BUFFER_BYTES.)
# Kubernetes: k8s/broker.yaml; docs/operations.md, "Running several brokers on Kubernetes".

# --- build: wheels of KafScale and of every dependency -------------------------------------
# Every compiled dependency (grpcio, pyzmq, msgspec, kio, lz4, zstandard, crc32c, cramjam) has a
# manylinux wheel for CPython 3.11 on x86_64 and aarch64; etcd3 is a source release, but pure
# Python. So neither stage needs a compiler.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kafscale ./kafscale
RUN pip wheel --no-cache-dir --disable-pip-version-check --wheel-dir /wheels .

# --- the image: the wheels installed, nothing else ------------------------------------------
FROM python:3.11-slim
# The wheels are bind-mounted from the build stage, not copied: they take no layer.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index --find-links=/wheels \
        kafscale \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/kafscale \
        --shell /usr/sbin/nologin kafscale \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/kafscale
# Without etcd and S3 the broker keeps its state in ./data (the embedded backends): here. Under
# Kubernetes the root filesystem is read-only and there is no such state (k8s/broker.yaml).
WORKDIR /var/lib/kafscale
# A container's loopback is its own: listen on every interface (advertised: the host name).
ENV KAFSCALE_BROKER_HOST=0.0.0.0
USER 10001
EXPOSE 9092 9093
ENTRYPOINT ["kafscale"]
CMD ["serve"]
