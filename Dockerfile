# syntax=docker/dockerfile:1
# inferlb gateway image: `docker build -t inferlb .` then `docker run -p 8080:8080 -e INFERLB_HOST=0.0.0.0 …`.
# Multi-stage: wheels are built with the build tools in the first stage; the runtime stage holds only
# a virtual environment, runs as an unprivileged user and writes nothing outside its volumes
# (journal, /tmp), so it runs with a read-only root filesystem (deploy/kubernetes/statefulset.yaml).
# Network at build time: PyPI only (pip); the processes and migrations ship inside the wheel.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY inferlb ./inferlb
COPY processes ./processes
COPY migrations ./migrations
# The gateway and PostgreSQL (psycopg's binary wheel: no libpq or compiler needed at runtime).
RUN python -m venv /opt/inferlb \
 && /opt/inferlb/bin/pip install --upgrade pip \
 && /opt/inferlb/bin/pip install ".[postgres]" \
 && /opt/inferlb/bin/python -m compileall -q /opt/inferlb/lib

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 inferlb \
 && useradd --system --uid 10001 --gid inferlb --home-dir /var/lib/inferlb --shell /usr/sbin/nologin inferlb \
 && mkdir -p /var/lib/inferlb/journal \
 && chown -R 10001:10001 /var/lib/inferlb
COPY --from=build /opt/inferlb /opt/inferlb
ENV PATH=/opt/inferlb/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    INFERLB_HOST=0.0.0.0 \
    INFERLB_PORT=8080 \
    INFERLB_JOURNAL_DIR=/var/lib/inferlb/journal
WORKDIR /var/lib/inferlb
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD ["python", "-c", "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2); sys.exit(0)"]
ENTRYPOINT ["inferlb"]
CMD ["serve"]
