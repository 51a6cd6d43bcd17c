#!/usr/bin/env bash
# The console's tests drive Debian's Chromium (through playwright-core, which downloads no
# browser). CI runs this before the tests (.ci/run): a machine without /usr/bin/chromium
# (or CHROMIUM_PATH) gets Debian's `chromium` package.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt-install.sh
. scripts/apt-install.sh

if [ -n "${CHROMIUM_PATH:-}" ] && [ -x "$CHROMIUM_PATH" ]; then
  echo "ensure-chromium: using $CHROMIUM_PATH"
elif [ -x /usr/bin/chromium ]; then
  echo "ensure-chromium: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
else
  echo "ensure-chromium: Chromium is missing; installing Debian's chromium"
  apt_install ensure-chromium chromium
  [ -x /usr/bin/chromium ] || { echo "ensure-chromium: FAILED: the chromium package is installed but /usr/bin/chromium is not there" >&2; exit 1; }
  echo "ensure-chromium: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
fi
