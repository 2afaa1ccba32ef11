"""`python -m clocktower.streams`: run the Faust worker (logs at CLOCKTOWER_STREAMS_LOG_LEVEL, warn by default).

Faust's web server is off: it would bind 0.0.0.0:6066 even with web_enabled=False.
"""

import logging
import sys

from prometheus_client import start_http_server
from pydantic import ValidationError

from clocktower.runtime.errors import UserError
from clocktower.runtime.lag_metrics import export_lag
from clocktower.runtime.parent_watch import watch_parent
from clocktower.runtime.settings_help import ALSO_READ, service_parser
from clocktower.streams.app import build_app
from clocktower.streams.registry import APP_ID, streams_reads
from clocktower.streams.settings import StreamsSettings


def main() -> None:
    parser = service_parser("python -m clocktower.streams", "The stream processors (a Faust worker); arguments after "
                            "the options go to Faust's `worker` command.", StreamsSettings, ALSO_READ)
    parser.parse_known_args()   # --help, and nothing else of ours
    try:   # settings and keys are read first: a problem there is one line, not a traceback
        settings = StreamsSettings()
        app = build_app(settings)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except ValidationError as exc:
        err = exc.errors()[0]
        print(f"error: bad configuration {'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}",
              file=sys.stderr, flush=True)
        sys.exit(2)
    watch_parent()
    if settings.streams_metrics_port:
        export_lag(settings.bootstrap, {APP_ID: streams_reads()})   # the streams group's lag, read when scraped
        try:
            start_http_server(settings.streams_metrics_port, addr=settings.metrics_host)
        except OSError as exc:   # metrics are not worth stopping the worker for
            logging.getLogger("streams").error("metrics endpoint not started: %s", exc)
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", settings.streams_log_level, *sys.argv[1:]]
    app.main()


if __name__ == "__main__":
    main()
