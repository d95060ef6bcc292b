# syntax=docker/dockerfile:1
# Two images from one wheel build:
#   the broker (the default target):   docker build -t kafscale:0.1.0 .
#   the operator (kafscale operator):   docker build --target operator -t kafscale-operator:0.1.0 .
# The broker image holds KafScale, its own dependencies and the `console` extra (aiohttp, jinja2,
# confluent-kafka: `kafscale console`, the web console, runs from this image; the broker never
# imports them); the operator image adds the `operator` extra (kopf, lightkube, confluent-kafka)
# instead.
# Run a broker:  docker run --shm-size 1g -p 9092:9092 -p 9093:9093 kafscale:0.1.0
# (/dev/shm holds the partition buffers: docker's default of 64 MiB is below KAFSCALE_BUFFER_BYTES.)
# Kubernetes: the Helm chart charts/kafscale (the operator, which runs KafscaleClusters of broker
# pods) or, without Helm, k8s/operator.yaml; brokers alone: k8s/broker.yaml and docs/operations.md,
# "Running several brokers on Kubernetes".

# --- build: wheels of KafScale and of every dependency, the operator and console extras' -----
# Every compiled dependency (grpcio, pyzmq, msgspec, kio, lz4, zstandard, crc32c, cramjam; for the
# operator and the console confluent-kafka (which bundles librdkafka), aiohttp, markupsafe and
# pyyaml) has a manylinux wheel for CPython 3.11 on x86_64 and aarch64; etcd-sdk-python (the etcd
# stubs) is pure Python. So neither stage needs a compiler.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kafscale ./kafscale
RUN pip wheel --no-cache-dir --disable-pip-version-check --wheel-dir /wheels ".[operator,console]"

# --- the operator image: KafScale with the operator extra -----------------------------------
# Runs `kafscale operator` (kopf, standalone: one replica) as the same non-root user as the
# broker; the chart's Deployment gives it a read-only root filesystem and an emptyDir /tmp.
FROM python:3.11-slim AS operator
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index --find-links=/wheels \
        "kafscale[operator]" \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/kafscale \
        --shell /usr/sbin/nologin kafscale \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/kafscale
WORKDIR /var/lib/kafscale
USER 10001
# GET /healthz, the liveness probe (KAFSCALE_OPERATOR_HEALTH_PORT).
EXPOSE 8080
ENTRYPOINT ["kafscale"]
CMD ["operator"]

# --- the broker image (the default target, so last): the wheels installed, nothing else -----
FROM python:3.11-slim AS broker
# The wheels are bind-mounted from the build stage, not copied: they take no layer. kafscale's
# own dependencies and the console extra's are installed from them, not the operator extra's.
# The same image runs `kafscale console` (the chart's console.enabled, k8s/console.yaml).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index --find-links=/wheels \
        "kafscale[console]" \
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
