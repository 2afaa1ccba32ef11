"""Where the CLI's one-shot commands reach Kafka: the external cluster, or the broker the data dir's `up` runs."""

from __future__ import annotations

from clocktower.config import Settings
from clocktower.runtime.errors import UserError
from clocktower.runtime.owner_note import read_owner


def running_bootstrap(settings: Settings) -> str:
    """CLOCKTOWER_KAFKA_BOOTSTRAP, else the embedded broker of the running `clocktower up` (UserError if none)."""
    if not settings.embedded_kafka:
        return settings.bootstrap
    owner = read_owner(settings.data_dir)
    if owner is None:
        raise UserError(f"no broker is running for {settings.data_dir}: start `clocktower up` first, "
                        "or set CLOCKTOWER_KAFKA_BOOTSTRAP")
    return str(owner["kafka"])
