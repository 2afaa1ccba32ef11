"""`python -m clocktower.streams`: run the Faust worker (logs at CLOCKTOWER_STREAMS_LOG_LEVEL, warn by default).

Faust's web server is off: it would bind 0.0.0.0:6066 even with web_enabled=False.
"""

import logging
import sys

from prometheus_client import start_http_server

from clocktower.runtime.parent_watch import watch_parent
from clocktower.streams.app import app, settings

if __name__ == "__main__":
    watch_parent()
    if settings.streams_metrics_port:
        try:
            start_http_server(settings.streams_metrics_port, addr=settings.metrics_host)
        except OSError as exc:   # metrics are not worth stopping the worker for
            logging.getLogger("streams").error("metrics endpoint not started: %s", exc)
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", settings.streams_log_level, *sys.argv[1:]]
    app.main()
