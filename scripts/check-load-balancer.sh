#!/usr/bin/env bash
# The example load balancer for several servers (deploy/haproxy/haproxy.cfg) is checked by
# HAProxy itself, and the many-servers test (test/cluster.e2e.test.ts) runs clients through
# it. CI runs this before the tests (.ci/run), after scripts/provision.sh installed haproxy.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian installs haproxy in /usr/sbin, which a user's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

command -v haproxy >/dev/null 2>&1 || { echo "check-load-balancer: FAILED: haproxy is not installed; run scripts/provision.sh (as root) or apt-get install -y haproxy" >&2; exit 1; }
echo "check-load-balancer: $(haproxy -v 2>&1 | head -n 1)"
haproxy -c -f deploy/haproxy/haproxy.cfg || { echo "check-load-balancer: FAILED: haproxy does not accept deploy/haproxy/haproxy.cfg; see above" >&2; exit 1; }
