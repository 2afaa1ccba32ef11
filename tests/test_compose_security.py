"""docker-compose.yml and Grafana's provisioning: no default passwords, Grafana's own read-only user.

There is no Docker engine on the build machines, so the files are checked as data: every secret is a
required variable (compose refuses to start without it), everything that talks to ClickHouse uses a named
user (never `default`), and Grafana's user is readonly=1 with SELECT only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from clocktower.config import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
SECRET_NAME = re.compile(r"PASSWORD|_KEY$|SECRET|TOKEN")
REQUIRED_VAR = re.compile(r"^\$\{([A-Z0-9_]+):\?[^}]+\}$")  # ${VAR:?message}: no default, compose fails if unset


def _env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}


def test_every_secret_in_compose_is_a_required_variable() -> None:
    secrets = {(name, key): value for name in SERVICES for key, value in _env(name).items() if SECRET_NAME.search(key)}
    assert secrets, "expected the ClickHouse, dashboards and control secrets"
    for (service, key), value in secrets.items():
        assert REQUIRED_VAR.match(value), f"{service}.{key} = {value!r}: a literal or defaulted secret"


def test_clients_of_clickhouse_use_named_users_and_grafana_the_read_only_one() -> None:
    server = _env("clickhouse")
    writer = server["CLICKHOUSE_USER"]
    assert "default" not in writer  # the image then removes its password-less `default` user
    clients = [s for s in SERVICES if "CLOCKTOWER_CLICKHOUSE_URL" in _env(s)]
    assert {"sink", "streams"} <= set(clients)
    for service in clients:
        env = _env(service)
        assert env["CLOCKTOWER_CLICKHOUSE_USER"] == writer and REQUIRED_VAR.match(env["CLOCKTOWER_CLICKHOUSE_PASSWORD"])
    grafana = _env("grafana")
    assert grafana["CLOCKTOWER_DASHBOARDS_USER"] == "dashboards"
    assert not any("CLOCKTOWER_CLICKHOUSE_PASSWORD" in v for v in grafana.values()), "Grafana got the writer's password"
    datasource = yaml.safe_load((ROOT / "grafana/provisioning/datasources/clickhouse.yaml").read_text())
    ds = datasource["datasources"][0]
    assert ds["jsonData"]["username"].startswith("${CLOCKTOWER_DASHBOARDS_USER")
    assert ds["secureJsonData"]["password"] == "${CLOCKTOWER_DASHBOARDS_PASSWORD}"  # no default


def test_the_dashboards_user_is_readonly_1_with_select_only() -> None:
    mounts = [v.split(":")[0] for v in SERVICES["clickhouse"]["volumes"] if v.startswith("./")]
    users_xml = next(ROOT / m for m in mounts if "users.d" in m)
    root = ET.parse(users_xml).getroot()
    user = root.find("users/dashboards")
    assert user is not None
    password = user.find("password")
    assert password is not None and not (password.text or "").strip(), "a literal password in the XML"
    env_name = password.get("from_env")
    assert env_name and REQUIRED_VAR.match(_env("clickhouse")[env_name])
    assert _env("clickhouse")[env_name] == _env("grafana")["CLOCKTOWER_DASHBOARDS_PASSWORD"]
    profile = root.find(f"profiles/{user.findtext('profile')}")
    assert profile is not None and profile.findtext("readonly") == "1"
    grants = [q.text or "" for q in user.findall("grants/query")]
    assert grants[0] == "GRANT SELECT ON default.*"
    assert all(re.fullmatch(r"GRANT SELECT ON system\.\w+", g) for g in grants[1:]), grants  # SELECT only
    for mount in mounts:
        assert (ROOT / mount).exists(), mount


def test_every_system_table_a_dashboard_reads_is_granted_to_grafana() -> None:
    # ClickHouse requires a grant for system tables (select_from_system_db_requires_grant): a panel reading
    # one that is not granted shows an error instead of data.
    root = ET.parse(ROOT / "grafana/clickhouse/users.d/dashboards.xml").getroot()
    granted = {q.text.removeprefix("GRANT SELECT ON ") for q in root.findall("users/dashboards/grants/query") if q.text}
    used: set[str] = set()
    for dashboard in (ROOT / "grafana/dashboards").glob("*.json"):
        for sql in re.findall(r'"rawSql":\s*"((?:[^"\\]|\\.)*)"', dashboard.read_text()):
            used |= {f"system.{t}" for t in re.findall(r"\bsystem\.(\w+)", sql, flags=re.IGNORECASE)}
    assert "system.parts" in used
    assert used <= granted, f"dashboards read {sorted(used - granted)} without a grant"


def test_metrics_bind_inside_containers_only_and_loopback_elsewhere() -> None:
    assert Settings.model_fields["metrics_host"].default == "127.0.0.1"
    for service, port_variable in (("sink", "CLOCKTOWER_METRICS_PORT"), ("streams", "CLOCKTOWER_STREAMS_METRICS_PORT")):
        assert _env(service)["CLOCKTOWER_METRICS_HOST"] == "0.0.0.0"
        assert int(_env(service)[port_variable]) > 0, f"{service} serves no metrics in compose"
        assert not SERVICES[service].get("ports"), f"{service} publishes its metrics port to the host"
    for service, spec in SERVICES.items():
        for port in spec.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), f"{service} publishes {port} beyond this host"


def test_make_compose_env_writes_fresh_private_secrets_once(tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "scripts/make_compose_env.py")]
    first, second = tmp_path / "a.env", tmp_path / "b.env"
    for path in (first, second):
        assert subprocess.run([*script, str(path)], capture_output=True, timeout=60).returncode == 0
    assert os.stat(first).st_mode & 0o777 == 0o600
    values = dict(line.split("=", 1) for line in first.read_text().splitlines())
    needed = {REQUIRED_VAR.match(v).group(1) for s in SERVICES for k, v in _env(s).items()  # type: ignore[union-attr]
              if REQUIRED_VAR.match(v)}
    assert values.pop("CLOCKTOWER_CLICKHOUSE_USER") == "clocktower"  # the CLI logs in as the writer, not `default`
    keys = Path(values.pop("CLOCKTOWER_SECRETS_DIR"))
    assert os.stat(keys / "control.key").st_mode & 0o777 == 0o600
    assert (keys / "control.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert (keys / "control.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    assert needed <= set(values) and all(len(v) >= 32 for v in values.values())
    assert first.read_text() != second.read_text()
    before = first.read_text()
    assert subprocess.run([*script, str(first)], capture_output=True, timeout=60).returncode == 1
    assert first.read_text() == before
