#!/usr/bin/env bash
# Make BCC (eBPF) usable from a Python environment on a Debian 12 machine. Idempotent; quiet when done.
#
#   setup_bcc.sh PREFIX      (run by `clocktower agent setup-ebpf`, and in a checkout by scripts/setup_bcc.sh,
#                             which `make setup-ebpf` runs; PREFIX is the venv or installation holding bin/python)
#
# Ships in the package (clocktower/producers/agent/ebpf/), so an agent installed from the wheel has it too.
# 1. apt-get installs python3-bpfcc (Debian's BCC 0.26, pure Python over ctypes + libbcc) if missing.
# 2. Fetches Debian's linux-headers-6.1.0-N-amd64 and -common with `apt-get download` (never
#    `apt-get install`: that pulls in a kernel image), unpacks them with `dpkg-deb -x` and merges the
#    two trees into $CLOCKTOWER_HEADERS_CACHE/linux-headers-6.1.0-N-amd64 (point BCC_KERNEL_SOURCE there).
#    Skipped when the running kernel's own headers are installed (/lib/modules/$(uname -r)/build).
# 3. Makes `import bcc` work in PREFIX, and only bcc: a directory holding a single symlink to Debian's
#    bcc package, appended to sys.path (after the environment's site-packages) by a .pth file. No other
#    Debian package becomes importable, so nothing in the environment can be shadowed.
# 4. Mounts tracefs on /sys/kernel/tracing if it is not mounted.
# Prints the headers directory (the last line of output is `BCC_KERNEL_SOURCE=...`).
set -euo pipefail

VENV="${1:?usage: setup_bcc.sh PREFIX (the venv or installation prefix; CLOCKTOWER_PYTHON: its interpreter)}"
PYTHON="${CLOCKTOWER_PYTHON:-$VENV/bin/python}"   # a system install's is python3, not $PREFIX/bin/python
CACHE="${CLOCKTOWER_HEADERS_CACHE:?set CLOCKTOWER_HEADERS_CACHE to where kernel headers are unpacked}"
DEBIAN_DIST=/usr/lib/python3/dist-packages

die() { echo "setup_bcc: error: $*" >&2; exit 1; }
say() { echo "setup_bcc: $*"; }

[ "$(uname -s)" = Linux ] || die "eBPF needs Linux (this is $(uname -s))"
[ "$(id -u)" = 0 ] || die "must run as root (apt-get, mount; the BPF programs themselves need CAP_BPF)"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian/Ubuntu only"
[ -x "$PYTHON" ] || die "no Python at $PYTHON (set CLOCKTOWER_PYTHON to the environment's interpreter)"

# -- 1. python3-bpfcc ---------------------------------------------------------------------------------------
if [ ! -f "$DEBIAN_DIST/bcc/__init__.py" ]; then
    say "installing python3-bpfcc with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends python3-bpfcc >/tmp/setup_bcc.apt.log 2>&1; then
        apt-get update -q >>/tmp/setup_bcc.apt.log 2>&1 || true
        apt-get install -y -q --no-install-recommends python3-bpfcc >>/tmp/setup_bcc.apt.log 2>&1 \
            || die "apt-get install python3-bpfcc failed; see /tmp/setup_bcc.apt.log"
    fi
    [ -f "$DEBIAN_DIST/bcc/__init__.py" ] || die "python3-bpfcc installed but $DEBIAN_DIST/bcc is missing"
fi

# -- 2. kernel headers ----------------------------------------------------------------------------------------
HEADERS=""
if [ -n "${BCC_KERNEL_SOURCE:-}" ] && [ -f "$BCC_KERNEL_SOURCE/include/linux/kconfig.h" ]; then
    HEADERS="$BCC_KERNEL_SOURCE"
elif [ -f "/lib/modules/$(uname -r)/build/include/linux/kconfig.h" ]; then
    HEADERS="/lib/modules/$(uname -r)/build"
else
    existing="$(ls -d "$CACHE"/linux-headers-6.1.0-*-amd64 2>/dev/null | sort -V | tail -n1 || true)"
    if [ -n "$existing" ] && [ -f "$existing/.complete" ]; then
        HEADERS="$existing"
    else
        # The newest Debian 6.1 ABI that apt knows of (6.12 headers fail on net/sock.h with BCC 0.26).
        abi="$(apt-cache search --names-only '^linux-headers-6\.1\.0-[0-9]+-amd64$' 2>/dev/null \
               | sed -nE 's/^linux-headers-6\.1\.0-([0-9]+)-amd64 .*/\1/p' | sort -n | tail -n1)"
        if [ -z "$abi" ]; then
            apt-get update -q >/dev/null 2>&1 || true
            abi="$(apt-cache search --names-only '^linux-headers-6\.1\.0-[0-9]+-amd64$' 2>/dev/null \
                   | sed -nE 's/^linux-headers-6\.1\.0-([0-9]+)-amd64 .*/\1/p' | sort -n | tail -n1)"
        fi
        [ -n "$abi" ] || die "apt-cache knows no linux-headers-6.1.0-N-amd64 package (is bookworm in sources.list?)"
        name="linux-headers-6.1.0-$abi-amd64"
        say "fetching $name and linux-headers-6.1.0-$abi-common (apt-get download, not installed)"
        tmp="$(mktemp -d)"
        trap 'rm -rf "$tmp"' EXIT
        (cd "$tmp" && apt-get download -q "$name" "linux-headers-6.1.0-$abi-common" >"$tmp/download.log" 2>&1) \
            || { cat "$tmp/download.log" >&2; die "apt-get download of the 6.1.0-$abi headers failed"; }
        mkdir -p "$tmp/root"
        for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root" || die "dpkg-deb -x $deb failed"; done
        src="$tmp/root/usr/src"
        [ -d "$src/$name" ] && [ -d "$src/linux-headers-6.1.0-$abi-common" ] || die "unexpected layout in the header packages"
        # Merge: the arch tree (generated headers, .config, Module.symvers) over the common tree.
        dest="$CACHE/$name"
        rm -rf "$dest" && mkdir -p "$dest"
        cp -a "$src/linux-headers-6.1.0-$abi-common/." "$dest/"
        # The arch package links back into ../linux-headers-*-common; those links are replaced by the real
        # files copied above.
        (cd "$src/$name" && find . -type l -lname "*linux-headers-6.1.0-$abi-common*" -delete)
        cp -a "$src/$name/." "$dest/"
        [ -f "$dest/include/generated/autoconf.h" ] || die "merged headers in $dest lack include/generated/autoconf.h"
        [ -f "$dest/include/linux/kconfig.h" ] || die "merged headers in $dest lack include/linux/kconfig.h"
        touch "$dest/.complete"
        rm -rf "$tmp"; trap - EXIT
        HEADERS="$dest"
        say "kernel headers unpacked into $HEADERS"
    fi
fi

# -- 3. bcc importable from the venv (and nothing else from Debian) --------------------------------------------
site="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
shim="$VENV/debian-bcc"
if [ "$(readlink "$shim/bcc" 2>/dev/null || true)" != "$DEBIAN_DIST/bcc" ]; then
    mkdir -p "$shim"
    ln -sfn "$DEBIAN_DIST/bcc" "$shim/bcc"
fi
pth="$site/debian-bcc.pth"
if [ "$(cat "$pth" 2>/dev/null || true)" != "$shim" ]; then
    printf '%s\n' "$shim" >"$pth"
fi
# Verify: bcc comes from Debian through the shim, and the shim holds nothing but bcc.
where="$("$PYTHON" -c 'import bcc, os; print(os.path.dirname(os.path.realpath(bcc.__file__)))' 2>&1)" \
    || die "import bcc fails in $VENV: $where"
[ "$where" = "$(realpath "$DEBIAN_DIST/bcc")" ] || say "note: bcc is imported from $where (the venv has its own)"
[ "$(ls -A "$shim")" = bcc ] || die "$shim must hold only the bcc link; found: $(ls -A "$shim" | tr '\n' ' ')"

# -- 4. tracefs ---------------------------------------------------------------------------------------------------
if [ ! -d /sys/kernel/tracing/events/sock ]; then
    mountpoint -q /sys/kernel/tracing 2>/dev/null || mount -t tracefs tracefs /sys/kernel/tracing \
        || die "cannot mount tracefs on /sys/kernel/tracing"
fi
[ -f /sys/kernel/tracing/events/sock/sock_send_length/format ] \
    || die "tracepoint sock:sock_send_length is missing from /sys/kernel/tracing (kernel too old?)"

echo "BCC_KERNEL_SOURCE=$HEADERS"
