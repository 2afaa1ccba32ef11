"""The Faust worker class the streams run: Faust's, without its terminal spinner's logging.

faust.Worker keeps a progress spinner whenever the log level is WARN or above (our default) and, to spin it on
every log message, sets the root logger to DEBUG with a DEBUG handler. Then every `log.debug` in Faust and
aiokafka (several per record sent) builds a LogRecord and runs the handlers: measured with py-spy on one worker
under benchmarks/streams_scaling.py, 5.6 % of its samples were in Logger.debug. Without the spinner the root logger
keeps the level asked for (CLOCKTOWER_STREAMS_LOG_LEVEL) and a disabled debug call costs a level check.
"""

from __future__ import annotations

import logging

import faust


class QuietWorker(faust.Worker):
    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        self.spinner = None   # (Faust's "Ready" line is then logged at info, instead of printed)
