"""`--help` for the services that take their configuration from the environment (pydantic-settings models).

`python -m clocktower.sinks.clickhouse` and `python -m clocktower.streams` read no options of their own: their
`--help` lists the variables their settings model reads, with each one's description and default, from the model
itself (never a hand-kept copy), and the service starts nothing. (The Kafka security and producer-key variables
are read by shared code, not these models: the help names where they are described.)
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import AliasChoices
from pydantic_settings import BaseSettings

ALSO_READ = ("Also read: CLOCKTOWER_KAFKA_SECURITY_PROTOCOL and the other Kafka TLS/SASL variables, and "
             "CLOCKTOWER_PRODUCER_KEY(_FILE); see the README's Configuration section.")


def variables(model: type[BaseSettings]) -> list[tuple[str, str]]:
    """(environment variable, its description and default) for each field of `model`."""
    prefix = str(model.model_config.get("env_prefix", ""))
    out = []
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        names = [c for c in alias.choices if isinstance(c, str) and c.isupper()] if isinstance(alias, AliasChoices) \
            else []
        env = names[0] if names else f"{prefix}{name}".upper()
        text = (field.description or "").strip()
        default: Any = field.get_default(call_default_factory=True)
        if default not in (None, "", (), [], {}):
            text += f" (default {default})" if text else f"default {default}"
        out.append((env, text))
    return out


def service_parser(prog: str, description: str, model: type[BaseSettings], note: str = "") -> argparse.ArgumentParser:
    """An argument parser whose --help lists `model`'s variables (the service takes no options itself). Only the
    whole word `--help`: no `-h` and no abbreviation, which the streams' Faust worker options use (`-h` is its
    web host)."""
    epilog = "configuration (environment variables):\n" + "\n".join(
        f"  {env}" + (f"\n      {text}" if text else "") for env, text in variables(model)) + (
        f"\n\n{note}" if note else "")
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog, add_help=False,
                                     allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--help", action="help", help="show this help message and exit")
    return parser
