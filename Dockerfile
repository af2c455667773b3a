# fastread with its GPU extras on CUDA 12, mirroring the README's install.
# xNVMe is a system prerequisite: install it per xNVMe's own guide before
# `pip install` to get the xNVMe engines (fastread does not build it).
FROM nvidia/cuda:12.6.3-runtime-ubuntu24.04

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-dev python3-venv build-essential pkg-config liburing-dev \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/fastread
COPY pyproject.toml CMakeLists.txt README.md ./
COPY csrc ./csrc
COPY src ./src
RUN pip install --no-cache-dir ".[gpu,plot]"

CMD ["fastread", "info"]
