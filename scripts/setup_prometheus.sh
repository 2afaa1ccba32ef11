#!/usr/bin/env bash
# Prometheus and promtool from Debian's package, unpacked into .cache/prometheus (never installed: no service, no
# user): tests/test_promql.py runs the pipeline-health dashboard's PromQL on a real Prometheus scraping our
# exporters. apt-get download needs no root; the package lists may need an update, which does.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/prometheus
[ -x "$dest/usr/bin/prometheus" ] && exit 0
command -v apt-get >/dev/null || { echo "setup_prometheus: apt-get not found; tests/test_promql.py will skip" >&2; exit 0; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && apt-get download -q prometheus >"$tmp/log" 2>&1); then
    apt-get update -q >>"$tmp/log" 2>&1 || true
    (cd "$tmp" && apt-get download -q prometheus >>"$tmp/log" 2>&1) \
        || { cat "$tmp/log" >&2; echo "setup_prometheus: apt-get download prometheus failed" >&2; exit 1; }
fi
mkdir -p "$dest"
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
mkdir -p "$dest/usr/bin"
cp "$tmp/root/usr/bin/prometheus" "$tmp/root/usr/bin/promtool" "$dest/usr/bin/"
echo "setup_prometheus: $("$dest/usr/bin/prometheus" --version 2>&1 | head -1)" >&2
