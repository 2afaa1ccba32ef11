"""What the CLI prints where a script reads it: its version, and lines never wrapped off a terminal."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from clocktower import consoles
from clocktower.result_table import print_table

REPO = Path(__file__).resolve().parent.parent


def test_version_is_the_installed_distributions() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    out = subprocess.run([sys.executable, "-m", "clocktower", "--version"], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == f"clocktower {version}"


@pytest.mark.parametrize("stderr", [False, True])
def test_a_long_line_is_not_wrapped_when_the_output_is_not_a_terminal(capsys: pytest.CaptureFixture[str],
                                                                       stderr: bool) -> None:
    line = "refused cmd-" + "0123456789abcdef" * 12 + " because of a reason that runs on well past 80 columns"
    out = consoles.console(stderr=stderr)
    assert not out.is_terminal
    out.print(line)
    captured = capsys.readouterr()
    assert (captured.err if stderr else captured.out) == line + "\n"


def test_a_table_wider_than_80_columns_is_printed_whole(capsys: pytest.CaptureFixture[str]) -> None:
    value = "node-07.cluster.example/eth2 " * 6
    print_table(["link", "n"], [[value.strip(), "3"]], ["String", "UInt64"])
    lines = capsys.readouterr().out.splitlines()
    assert any(value.strip() in line for line in lines), lines


def test_an_error_line_through_a_pipe_is_one_line() -> None:
    missing = "/nonexistent/" + "a-long-data-directory-name-" * 5
    out = subprocess.run([sys.executable, "-m", "clocktower", "query", "--data-dir", missing, "SELECT 1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr


def test_the_kernel_headers_go_where_the_environment_says_else_into_the_checkout(monkeypatch) -> None:  # noqa: ANN001
    from clocktower.runtime.bcc_build import headers_cache

    monkeypatch.delenv("CLOCKTOWER_HEADERS_CACHE", raising=False)
    assert headers_cache() == REPO / ".cache" / "kernel-headers"
    monkeypatch.setenv("CLOCKTOWER_HEADERS_CACHE", "/var/tmp/headers")
    assert headers_cache() == Path("/var/tmp/headers")


def test_agent_setup_ebpf_runs_the_script_the_package_ships() -> None:
    import os

    from clocktower.producers.agent.ebpf._bcc import SETUP_SCRIPT

    assert SETUP_SCRIPT.is_file()   # package data: the wheel's contents are checked in test_packaging
    if os.geteuid() != 0:
        pytest.skip("setup-ebpf needs root (apt-get, mount)")
    out = subprocess.run([sys.executable, "-m", "clocktower", "agent", "setup-ebpf"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1].startswith("BCC_KERNEL_SOURCE=/"), out.stdout


def test_agent_setup_ebpf_refuses_the_agent_s_options() -> None:
    """setup-ebpf readies the node and runs nothing: an option meant for the agent was silently ignored."""
    out = subprocess.run([sys.executable, "-m", "clocktower", "agent", "setup-ebpf", "--node", "n1", "--stdout",
                          "--duration", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "setup-ebpf takes no option (--node, --stdout, --duration given)" in out.stderr, out
