# One image for the sink and the stream processors (and the CLI).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY producers producers
COPY streams streams
COPY sinks sinks
COPY actuators actuators
COPY clocktower clocktower
RUN pip install --no-cache-dir .
ENV CLOCKTOWER_DATA_DIR=/data
CMD ["clocktower", "--help"]
