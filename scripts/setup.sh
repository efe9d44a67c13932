#!/usr/bin/env bash
# Set up ibemu on a Debian/Ubuntu machine: system packages (when root), a venv, the package.
# Idempotent: a second run only checks. Usage: scripts/setup.sh [--no-apt]
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3-venv python3-dev iproute2 tshark ibsim-utils opensm infiniband-diags)
# Mininet for the `mn --custom` adapter (ibemu/mininet/custom.py); without its recommended
# Open vSwitch: IB fabrics need no OpenFlow switch or controller. bridge-utils: `mn --switch
# lxbr` calls brctl.
APT_PACKAGES+=(mininet bridge-utils)
# The device firmware's eBPF programs are C, built with clang -target bpf against libbpf's
# headers (no kernel headers needed); OpenSM runs on the dilated clock under libfaketime.
APT_PACKAGES+=(clang libbpf-dev libfaketime)
# The C twin of OpenSM's MAD-socket path (ibemu/kernel/c_src/madtwin.c): a C compiler and libc's headers.
APT_PACKAGES+=(gcc libc6-dev)
# node_exporter reads the fabric's per-host sysfs trees (tests/integration/test_metrics_live.py).
APT_PACKAGES+=(prometheus-node-exporter)
# The browser tests of the HTML report and the live page (`ibemu up --web`) drive headless Chromium.
APT_PACKAGES+=(chromium)
VENV=${IBEMU_VENV:-.venv}

want_apt=1
[ "${1:-}" = "--no-apt" ] && want_apt=0

missing=()
if [ "$want_apt" = 1 ] && command -v dpkg-query >/dev/null 2>&1; then
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "setup: not root, skipping system packages: ${missing[*]} (tests needing them will skip)" >&2
    fi
fi

PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
stamp="$VENV/.ibemu-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -e '.[test]'
    touch "$stamp"
fi
# The kernel SMA's eBPF object (ibemu/kernel/bpf_src/sma.o): without clang the fabric runs
# its management on the Python agents (and says so once).
if command -v clang >/dev/null 2>&1; then
    make -s bpf || echo "setup: the eBPF SMA did not build: management stays with the Python agents"
fi
if command -v cc >/dev/null 2>&1; then
    # madtwin, and the link model and forwarder compiled with mypyc (python3-dev: Python's headers)
    make -s native VENV="$VENV" || echo "setup: madtwin or the compiled link model did not build:" \
        "OpenSM's SMPs take the agent host's Python path, the hot path runs interpreted"
fi
# Shell completion (`ibemu completion bash`): into bash-completion's folder (IBEMU_BASH_COMPLETION_DIR)
# when root; rewritten
# only when it changed.
COMPLETION_DIR=${IBEMU_BASH_COMPLETION_DIR:-/etc/bash_completion.d}
if [ "$(id -u)" = 0 ] && [ -d "$COMPLETION_DIR" ]; then
    tmp=$(mktemp)
    if "$VENV/bin/ibemu" completion bash >"$tmp"; then
        if ! cmp -s "$tmp" "$COMPLETION_DIR/ibemu"; then
            install -m 0644 "$tmp" "$COMPLETION_DIR/ibemu"
            echo "setup: installed bash completion in $COMPLETION_DIR/ibemu"
        fi
    else
        echo "setup: could not generate the bash completion (ibemu completion bash failed)" >&2
    fi
    rm -f "$tmp"
elif [ "$(id -u)" != 0 ]; then
    echo "setup: not root, skipping the bash completion (or: $VENV/bin/ibemu completion bash >> ~/.bash_completion)" >&2
else
    echo "setup: no $COMPLETION_DIR, skipping the bash completion (ibemu completion bash|zsh prints it)" >&2
fi
echo "setup: ready ($("$VENV/bin/python" --version), venv $VENV)"
