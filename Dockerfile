# One image for the sink and the stream processors (and the CLI); the `agent` target adds BCC for the node agent.
FROM python:3.11-slim AS base
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY schemas schemas
COPY runtime runtime
COPY producers producers
COPY streams streams
COPY sinks sinks
COPY control control
COPY actuators actuators
COPY clocktower clocktower
RUN pip install --no-cache-dir .
ENV CLOCKTOWER_DATA_DIR=/data
CMD ["clocktower", "--help"]

# The node agent: BCC from Debian (pure Python over libbcc, imported through a .pth), run privileged with
# the host's /lib/modules (kernel headers) and tracefs mounted (see docker-compose.yml, profile "agent").
FROM base AS agent
RUN apt-get update && apt-get install -y --no-install-recommends python3-bpfcc \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/debian-bcc && ln -s /usr/lib/python3/dist-packages/bcc /opt/debian-bcc/bcc \
    && echo /opt/debian-bcc > /usr/local/lib/python3.11/site-packages/debian-bcc.pth
CMD ["clocktower", "agent"]
