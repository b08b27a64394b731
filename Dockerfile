# The prfaas image every pod of `prfaas k8s` runs (gateway, nodes, Endpoint Picker).
#   docker build -t prfaas:0.1.0 .        (then: prfaas k8s FILE -o DIR --image prfaas:0.1.0)
# torch==2.13.0 from the default index is its CUDA build (GPU nodes need the host's driver); for
# a smaller CPU-only image (timed and torch-on-CPU nodes) install torch's CPU wheel first. vLLM
# sites need vLLM in the image too (docs/kubernetes.md, "Images").
# Not built or run here (no container runtime on the development machines): docs/kubernetes.md
# says what was validated.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/prfaas \
 && /opt/prfaas/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/prfaas/bin/pip install --no-cache-dir '.[engine,serve,k8s]'

FROM python:3.11-slim
COPY --from=build /opt/prfaas /opt/prfaas
ENV PATH=/opt/prfaas/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp
# The pods run as this user (runAsUser 10001); /run/prfaas is a memory-backed volume there.
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin prfaas
USER 10001
ENTRYPOINT ["python", "-m", "prfaas.k8s.entry"]
