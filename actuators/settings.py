"""The actuator's settings (CLOCKTOWER_ACTUATOR_* variables): the controller's public key, its state, the hooks.

There is no built-in key: without CLOCKTOWER_ACTUATOR_PUBLIC_KEY_FILE (or CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE) the
actuator takes the control.pub that `clocktower up` writes into CLOCKTOWER_DATA_DIR, and refuses to start, saying
so in one line, when there is none. Hooks are argv lists, never run through a shell: JSON (`["/usr/local/bin/drain",
"--reason", "clocktower"]`) or a shell-like string split with shlex (`/usr/local/bin/drain --reason clocktower`).
"""

from __future__ import annotations

import ipaddress
import shlex
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from clocktower.actuators.qos_leases import DEFAULT_LEASE_S, MAX_LEASE_S
from clocktower.runtime.broker_profile import BrokerProfile, profile_field, profile_settings
from clocktower.runtime.credentials import control_public_key_path
from clocktower.runtime.errors import UserError
from clocktower.runtime.setting_text import json_or_text

Argv = Annotated[tuple[str, ...], NoDecode]


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as e:
        raise ValueError(f"hook cannot be split into arguments: {e}") from None


def parse_argv(value: Any) -> tuple[str, ...]:
    """A hook command: a list of strings, its JSON, or a string split like a shell would (but never run by one)."""
    if value is None:
        return ()
    value = json_or_text(value, "[", "hook", _split)
    if not isinstance(value, list | tuple) or not all(isinstance(a, str) for a in value):
        raise ValueError("a hook is a list of strings (the program and its arguments)")
    if value and not value[0]:
        raise ValueError("a hook's program is empty")
    return tuple(value)


def _rates(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        link, eq, rate = item.partition("=")
        if not eq or not link.strip():
            raise ValueError(f"qos_links item {item!r} is not LINK=MBITS")
        try:
            out[link.strip()] = int(rate)
        except ValueError:
            raise ValueError(f"qos_links: {rate!r} is not a whole number of Mbit/s") from None
    return out


def parse_qos_links(value: Any) -> dict[str, int]:
    """`{"eth0": 400000}` (a dict or its JSON) or `eth0=400000,eth1=400000` -> {link: Mbit/s}; ValueError says why."""
    value = json_or_text(value, "{", "qos_links", _rates)
    if not isinstance(value, dict):
        raise ValueError("qos_links must be a JSON object or LINK=MBITS,... pairs")
    for link, rate in value.items():
        if not isinstance(link, str) or not 0 < len(link) <= 64 or not isinstance(rate, int) or \
                not 0 < rate <= 10_000_000:
            raise ValueError(f"qos_links: {link!r}={rate!r} is not a link name and a rate in (0, 10,000,000] Mbit/s")
    return dict(value)


def _paths(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        port, eq, rest = item.partition("=")
        alternate, _, hop = rest.partition("@")
        if not eq or not port.strip() or not alternate.strip():
            raise ValueError(f"redirect_paths item {item!r} is not PORT=ALTERNATE or PORT=ALTERNATE@NEXTHOP")
        out[port.strip()] = [alternate.strip(), hop.strip() or None]
    return out


def parse_redirect_paths(value: Any) -> dict[str, tuple[str, str | None]]:
    """`eth0=eth1,eth2=eth3@10.2.0.254` or JSON `{"eth0": ["eth1", null]}` -> {port: (alternate, next hop)}."""
    value = json_or_text(value, "{", "redirect_paths", _paths)
    if not isinstance(value, dict):
        raise ValueError("redirect_paths must be a JSON object or PORT=ALTERNATE[@NEXTHOP],... items")
    out: dict[str, tuple[str, str | None]] = {}
    for port, path in value.items():
        if isinstance(path, str):
            alternate, hop = path, None
        elif isinstance(path, list | tuple) and 1 <= len(path) <= 2:
            alternate, hop = path[0], path[1] if len(path) == 2 else None
        else:
            alternate, hop = "", None
        names = (port, alternate)
        if not all(isinstance(n, str) and 0 < len(n) <= 15 for n in names) or port == alternate:
            raise ValueError(f"redirect_paths: {port!r}={path!r} is not two different port names")
        if hop is not None:
            try:
                hop = str(ipaddress.ip_address(hop))
            except ValueError:
                raise ValueError(f"redirect_paths: next hop {hop!r} of {port} is not an IP address") from None
        out[port] = (alternate, hop)
    return out


class ActuatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLOCKTOWER_ACTUATOR_", extra="ignore", populate_by_name=True)

    public_key_file: Path | None = Field(default=None, validation_alias=AliasChoices(
        "public_key_file", "CLOCKTOWER_ACTUATOR_PUBLIC_KEY_FILE", "CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE"),
        description="the controller's Ed25519 public key (PEM); default: control.pub in CLOCKTOWER_DATA_DIR")
    data_dir: Path | None = Field(default=None, validation_alias=AliasChoices("data_dir", "CLOCKTOWER_DATA_DIR"),
                                  description="where `clocktower up` wrote control.pub")
    state_dir: Path = Field(default=Path(".clocktower-agent/actuator"), description=(
        "the handled command ids (replays are refused after a restart) and the quarantined links"))
    drain_hook: Argv = Field(default=(), description="run for `drain` commands (e.g. hook_examples/slurm-drain.sh)")
    undrain_hook: Argv = Field(default=(), description=(
        "run for `undrain` commands, which `clocktower control undrain NODE` sends (e.g. slurm-resume.sh)"))
    spare_hook: Argv = Field(default=(), description=(
        "run for `spare` commands on the spare node (e.g. hook_examples/slurm-resume.sh or k8s-uncordon.sh)"))
    hook_timeout_s: float = Field(default=30.0, gt=0, le=3600, description="a hook still running then is killed")
    idle_fetch_backoff_ms: float | None = Field(default=None, ge=0, le=10_000, description=(
        "the command consumer's wait after a fetch that brought nothing: a command waits at most this long (plus a "
        "fetch) to be read. Unset: the broker profile's (0 with `kafka`, which holds an empty fetch itself; 25 with "
        "`embedded`, about 40 fetches a second of one partition)"))
    broker_profile: BrokerProfile = profile_field()

    @property
    def idle_backoff_s(self) -> float:
        ms = self.idle_fetch_backoff_ms
        return profile_settings(self.broker_profile).actuator_idle_backoff_s if ms is None else ms / 1e3
    qos_links: Annotated[dict[str, int], NoDecode] = Field(default_factory=dict, description=(
        "the links whose egress this node shapes for `rate_limit`/`pause`/`resume`, with their rates in Mbit/s, as "
        "eth0=400000,eth1=400000 or JSON; none: QoS commands are refused"))
    redirect_paths: Annotated[dict[str, tuple[str, str | None]], NoDecode] = Field(default_factory=dict, description=(
        "each port's alternate port for `redirect` (the low class toward a congested destination leaves by it), as "
        "eth0=eth1,eth1=eth0 or eth0=eth1@NEXTHOP, or JSON; needs root, BCC and kernel headers. None: a `redirect` "
        "slows the low class instead, as `rate_limit` does"))
    kernel_source: str | None = Field(default=None, description="kernel headers for BCC (default: found as the "
                                      "agent finds them)")
    qos_lease_s: float = Field(default=DEFAULT_LEASE_S, ge=1, le=MAX_LEASE_S, description=(
        "how long a `rate_limit`/`pause` holds without renewal when its command names no `lease_s` (the congestion "
        "detector names one, and renews it while the congestion lasts): a lost `resume` lifts the cap after this"))
    watchdog_ms: float = Field(default=50.0, ge=0, le=60_000, description=(
        "T_watchdog: a primary link without carrier this long is failed over by the agent itself (0: at once)"))

    @field_validator("qos_links", mode="before")
    @classmethod
    def _qos_links(cls, value: Any) -> dict[str, int]:
        return parse_qos_links(value)

    @field_validator("redirect_paths", mode="before")
    @classmethod
    def _redirect_paths(cls, value: Any) -> dict[str, tuple[str, str | None]]:
        return parse_redirect_paths(value)

    @field_validator("drain_hook", "undrain_hook", "spare_hook", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> tuple[str, ...]:
        return parse_argv(value)

    def public_key_path(self) -> Path:
        """The key file to verify commands with; UserError (one line) when none is configured or generated."""
        if self.public_key_file is not None:
            return self.public_key_file
        if self.data_dir is not None:
            path = control_public_key_path(self.data_dir)
            if path.exists():
                return path
            raise UserError(f"no controller public key: {path} does not exist (`clocktower up` writes it on first "
                            "start); set CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE to the streams' control.pub")
        raise UserError("no controller public key: set CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE to the streams' "
                        "control.pub (or CLOCKTOWER_DATA_DIR to the data dir `clocktower up` wrote it into)")

    def hooks(self) -> dict[str, tuple[str, ...]]:
        """action -> hook argv, for the configured ones."""
        return {a: h for a, h in (("drain", self.drain_hook), ("spare", self.spare_hook),
                                  ("undrain", self.undrain_hook)) if h}
