# Sluice: one image for the router, the scheduler and the worker (the command picks the service).
# CPU image by default. For GPUs, build on a CUDA base that has Python 3.10+ and pick a CUDA build of torch:
#   docker build -t sluice:gpu --build-arg BASE_IMAGE=<a CUDA runtime image with python3> \
#     --build-arg TORCH_SPEC="torch==2.13.0" --build-arg EXTRAS="model,gpu" .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=""
ARG EXTRAS="model"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SLUICE_CACHE_DIR=/opt/sluice/cache

WORKDIR /opt/sluice/src
RUN python3 -m pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "${TORCH_SPEC}"
COPY pyproject.toml setup.py README.md ./
COPY protos ./protos
COPY sluice ./sluice
COPY router ./router
COPY scheduler_svc ./scheduler_svc
COPY worker_svc ./worker_svc
COPY kernels ./kernels
RUN python3 -m pip install --no-cache-dir ".[${EXTRAS}]" \
    && sluice fetch-model \
    && useradd --uid 10001 --no-create-home sluice \
    && chmod -R a+rX /opt/sluice

USER 10001
EXPOSE 50051 50052 50053 9090
ENTRYPOINT ["sluice"]
CMD ["serve", "--host", "0.0.0.0"]
