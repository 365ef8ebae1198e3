# One image for the four Strand services (compose picks the command).
#   CPU (default):  docker compose build
#   CUDA:           docker compose build \
#                     --build-arg BASE_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04 \
#                     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# CUDA bases come without Python: install it there (the slim base already has it).
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    STRAND_CACHE_DIR=/models/.cache

WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos protos
COPY strand strand
# torch from its own index: PyPI's default wheel pulls several GB of CUDA packages.
RUN pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" .
# The CPU kernels (strand/kernels/csrc) are C++ built with torch's cpp_extension: without a compiler the
# services would silently run the slower pure-torch path. They are built here, for this build
# machine's ISA level, into the image; g++ stays so a host of another level builds its own once.
ENV TORCH_EXTENSIONS_DIR=/opt/strand/torch_extensions
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/* \
    && python -m strand.kernels.build

# Extra pip requirements, last so the layers above are shared: compose's smg profile adds smg.
ARG EXTRA_PACKAGES=""
RUN if [ -n "${EXTRA_PACKAGES}" ]; then pip install --no-cache-dir ${EXTRA_PACKAGES}; fi

EXPOSE 50051 50052 50053 50054
CMD ["strand", "serve", "--host", "0.0.0.0"]
