"""Run the operator's hook for a command (drain, spare): how a node leaves or joins the scheduler is theirs.

The hook is an argv list, run without a shell, with the command's fields appended as arguments:
`argv + [action, node, target, params as JSON]`, and also in the environment (CLOCKTOWER_ACTION, _NODE, _TARGET,
_PARAMS, _COMMAND_ID, _INCIDENT_ID), so a script picks what it needs. The fields come from a verified command, yet
they are still never parsed by a shell. A hook runs in its own process group, is killed (with its children) after
`timeout_s`, and the last `OUTPUT_LIMIT` characters of its output (stdout and stderr) go into the ack's detail.
Examples for Slurm and Kubernetes are in actuators/hook_examples/.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping

import orjson

from clocktower.schemas.control import ControlCommand

OUTPUT_LIMIT = 2000


class HookError(Exception):
    """The hook could not run, failed or timed out; the message (with its output) goes into the ack."""


def _tail(out: bytes) -> str:
    text = out.decode("utf-8", "replace").strip()
    return text if len(text) <= OUTPUT_LIMIT else "..." + text[-OUTPUT_LIMIT:]


class Hooks:
    """action -> argv of the hook that carries it out (only the configured actions)."""

    def __init__(self, hooks: Mapping[str, tuple[str, ...] | list[str]], timeout_s: float = 30.0) -> None:
        self.hooks = {a: tuple(argv) for a, argv in hooks.items() if argv}
        self.timeout_s = timeout_s

    def has(self, action: str) -> bool:
        return action in self.hooks

    def run(self, cmd: ControlCommand) -> str:
        """Run `cmd.action`'s hook; returns its output (bounded); raises HookError when it fails."""
        argv = self.hooks.get(cmd.action)
        if argv is None:
            raise HookError(f"no {cmd.action} hook configured (CLOCKTOWER_ACTUATOR_{cmd.action.upper()}_HOOK)")
        params = orjson.dumps(cmd.params, option=orjson.OPT_SORT_KEYS).decode()
        env = {**_hook_base_env(), "CLOCKTOWER_ACTION": cmd.action, "CLOCKTOWER_NODE": cmd.node,
               "CLOCKTOWER_TARGET": cmd.target, "CLOCKTOWER_PARAMS": params,
               "CLOCKTOWER_COMMAND_ID": cmd.command_id, "CLOCKTOWER_INCIDENT_ID": cmd.incident_id}
        try:
            proc = subprocess.Popen([*argv, cmd.action, cmd.node, cmd.target, params], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        except OSError as exc:
            raise HookError(f"{cmd.action} hook {argv[0]!r} could not start: {exc.strerror or exc}") from None
        try:
            out, _ = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)   # the hook and whatever it started
            proc.kill()
            try:
                out, _ = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:   # a descendant that left the group still holds the pipe
                out = b""
            raise HookError(f"{cmd.action} hook timed out after {self.timeout_s:g} s; output: {_tail(out)}") from None
        if proc.returncode != 0:
            raise HookError(f"{cmd.action} hook exited with {proc.returncode}; output: {_tail(out)}")
        return _tail(out)


HOOK_ENV_PASSED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "KUBECONFIG", "SLURM_CONF", "USER", "LOGNAME")


def _hook_base_env() -> dict[str, str]:
    """Only what a drain/spare tool needs from the agent's environment: never its secrets (Kafka password, node
    key), since a hook's output goes into the ack, which any dashboard user can read."""
    return {k: v for k, v in os.environ.items() if k in HOOK_ENV_PASSED}
