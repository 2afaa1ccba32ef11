"""The topics the stream processors read: the one list the Faust app, the drain check and `topics` lag use.

Kept apart from app.py so that readers of the list need not build the Faust app (which loads the control key).
"""

INPUT_TOPICS: tuple[str, ...] = ("telemetry.clock", "telemetry.flows", "telemetry.collectives",
                                 "telemetry.iterations", "telemetry.links", "telemetry.gpu")
