#!/usr/bin/env bash
# Debian's chromium, for tests/test_report.py: it renders `clocktower report`'s HTML headless, checks that every
# chart drew with no console error, and keeps a screenshot. Needs root (apt-get); does nothing if it is there.
set -euo pipefail
command -v chromium >/dev/null && exit 0
die() { echo "setup_chromium: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "chromium is missing and installing it needs root: sudo apt-get install chromium"
command -v apt-get >/dev/null || die "apt-get not found: install chromium yourself (tests/test_report.py needs it)"
export DEBIAN_FRONTEND=noninteractive
echo "setup_chromium: installing chromium with apt-get" >&2
if ! apt-get install -y -q --no-install-recommends chromium >/tmp/setup_chromium.apt.log 2>&1; then
    apt-get update -q >>/tmp/setup_chromium.apt.log 2>&1 || true
    apt-get install -y -q --no-install-recommends chromium >>/tmp/setup_chromium.apt.log 2>&1 \
        || die "apt-get install chromium failed; see /tmp/setup_chromium.apt.log"
fi
command -v chromium >/dev/null || die "chromium installed but not on PATH"
