#!/bin/sh
# Installs the Debian packages semflow's build and tests need, once (root, apt-get).
# Quiet when everything is present.
set -e
PKGS="build-essential pkg-config libevent-dev libjansson-dev libpcre2-dev libncurses-dev \
      libbpf-dev libelf-dev zlib1g-dev libzstd-dev bpftool clang llvm python3 curl \
      nodejs chromium python3-matplotlib $(command -v npm >/dev/null || echo npm)"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "semflow: installing missing packages:$missing"
if [ "$(id -u)" != 0 ]; then
    echo "semflow: need root to install packages (run: sudo apt-get install -y$missing)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing >/tmp/semflow-apt.log 2>&1 || { tail -20 /tmp/semflow-apt.log; exit 1; }
