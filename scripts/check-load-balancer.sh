#!/usr/bin/env bash
# The example load balancer for several servers (deploy/haproxy/haproxy.cfg) is checked by
# HAProxy itself, and the many-servers test (test/cluster.e2e.test.ts) runs clients through
# it. CI runs this before the tests (.ci/run): a machine without haproxy gets Debian's.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt-install.sh
. scripts/apt-install.sh

if ! command -v haproxy >/dev/null 2>&1; then
  echo "check-load-balancer: haproxy is missing; installing Debian's haproxy"
  apt_install check-load-balancer haproxy
  command -v haproxy >/dev/null 2>&1 || { echo "check-load-balancer: FAILED: the haproxy package is installed but haproxy is not on PATH" >&2; exit 1; }
fi
echo "check-load-balancer: $(haproxy -v 2>&1 | head -n 1)"
haproxy -c -f deploy/haproxy/haproxy.cfg || { echo "check-load-balancer: FAILED: haproxy does not accept deploy/haproxy/haproxy.cfg; see above" >&2; exit 1; }
