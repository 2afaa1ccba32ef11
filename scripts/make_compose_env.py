"""Write .env for docker compose with fresh random secrets (0600, never overwrites an existing file).

docker-compose.yml has no default passwords or keys and refuses to start without these:
the ClickHouse writer's password, Grafana's read-only `dashboards` password, Grafana's admin
password; and the directory (CLOCKTOWER_SECRETS_DIR, `secrets/` next to .env) holding the Ed25519 pair that signs
control commands: control.key (0600, mounted into the streams only; it must be owned by the containers' user)
and control.pub (mounted into the agent). It also names the writer (CLOCKTOWER_CLICKHOUSE_USER), so a shell that
sources .env logs the CLI in as that user: the image removes `default`.

    python scripts/make_compose_env.py [PATH]    # default: .env next to docker-compose.yml
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clocktower.generated_secrets import ensure_control_keys  # noqa: E402
from clocktower.runtime.private_file import create_private_file, private_dir  # noqa: E402

USER = "clocktower"  # docker-compose.yml's default for CLOCKTOWER_CLICKHOUSE_USER
NAMES = ("CLOCKTOWER_CLICKHOUSE_PASSWORD", "CLOCKTOWER_DASHBOARDS_PASSWORD", "CLOCKTOWER_GRAFANA_ADMIN_PASSWORD")


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / ".env"
    secrets_dir = path.resolve().parent / "secrets"
    text = f"CLOCKTOWER_CLICKHOUSE_USER={USER}\n" + "".join(f"{name}={secrets.token_urlsafe(32)}\n" for name in NAMES)
    text += f"CLOCKTOWER_SECRETS_DIR={secrets_dir}\n"
    if not create_private_file(path, text.encode()):
        print(f"{path} exists: kept as it is (delete it to generate new secrets)", file=sys.stderr)
        return 1
    private_dir(secrets_dir)
    made = ensure_control_keys(secrets_dir)
    print(f"wrote {path} (mode 0600): {', '.join(NAMES)}; control key pair in {secrets_dir} "
          f"({'new' if made else 'kept'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
