#!/usr/bin/env bash
# Installs what the harness's own tests need on a fresh Debian machine: the harness with its
# test extra, and the real servers the transport tests talk to (OpenSSH server, adb).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v adb >/dev/null 2>&1 || need+=(adb)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -m pip install -q -e '.[test]'
