# Baton's gateway (and its engine emulator) as a container.
#   docker build -t baton .
#   docker run --rm -p 8000:8000 -v $PWD/examples/docker/gateway.yaml:/etc/baton/gateway.yaml:ro baton
# compose.yaml starts a gateway in front of three emulators.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLBACKEND=Agg MPLCONFIGDIR=/tmp/matplotlib

# a non-root user with a fixed uid (Kubernetes' runAsNonRoot checks it)
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin baton

WORKDIR /build
COPY pyproject.toml README.md ./
COPY src ./src
# the endpoint picker's extras (gRPC, the ext_proc messages, the Kubernetes client for
# discovery): charts/baton runs `baton epp` from this image
ARG EXTRAS="[epp,k8s]"
RUN pip install ".${EXTRAS}" && rm -rf /build

USER 10001
WORKDIR /home/baton
EXPOSE 8000
# /health is 200 while some engine takes work and 503 (with the reason) while none does
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]
ENTRYPOINT ["baton"]
CMD ["serve", "--config", "/etc/baton/gateway.yaml", "--host", "0.0.0.0", "--port", "8000"]
