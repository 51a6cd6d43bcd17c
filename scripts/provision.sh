#!/usr/bin/env bash
# Provisions what the test suite needs on a machine of this project's kind (Debian, Node 20):
# the tools some tests drive, from Debian's packages, and a check that PostgreSQL answers.
# `npm test` (scripts/run-tests.mjs) and `.ci/run` both call it, so a fresh clone's
# `npm ci && npm test` needs nothing installed by hand.
#
#   tool       Debian package            used by
#   haproxy    haproxy                   test/cluster.e2e.test.ts, scripts/check-load-balancer.sh
#   chromium   chromium                  the console's browser tests (test/console*.e2e.test.ts)
#   promtool   prometheus                scripts/check-monitoring.sh
#   amtool     prometheus-alertmanager   scripts/check-monitoring.sh
#   cmake      cmake                     `llmgw engine build` (below)
#   g++        g++                       `llmgw engine build`
#   make       make                      `llmgw engine build`
#   git        git                       `llmgw engine build` (unpacks llama.cpp's source bundle)
#
# Then the real llama-server the end-to-end tests run (test/llama-server.e2e.test.ts):
# `llmgw engine build` compiles it from the llama.cpp source node-llama-cpp ships, once, into
# ~/.cache/llmgw/llama.cpp/<commit>/ (15–25 minutes on 2 cores); every later run finds it
# there in a second. LLMGW_SKIP_LLAMA_SERVER_BUILD=1 leaves it out (those tests then fail
# with a sentence saying so).
#
# What is missing is installed in one apt-get run (as root, or through sudo). Where that is
# impossible (no apt-get, no root and no sudo, no registry), it says which tools are missing
# and the command that installs them, and exits 0 unless --strict is given: the tests that
# need a missing tool then fail with that same sentence (test/support/tools.ts), and the
# rest of the suite still runs. CI passes --strict.
#
# PostgreSQL: the store tests use postgres://postgres@127.0.0.1:5432/test (LLMGW_TEST_POSTGRES
# overrides it). This machine kind starts the server before a session; a stopped cluster that
# is installed is started here. Where it cannot be reached and LLMGW_REQUIRE_POSTGRES=1, this
# fails; otherwise it says that those tests will be skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt-install.sh
. scripts/apt-install.sh

strict=0
[ "${1:-}" = "--strict" ] && strict=1

say() { printf 'provision: %s\n' "$*"; }

# tool:package pairs, in the order of the table above.
wanted=(haproxy:haproxy chromium:chromium promtool:prometheus amtool:prometheus-alertmanager cmake:cmake g++:g++ make:make git:git)

# Debian puts haproxy in /usr/sbin, which a user's PATH often lacks: look there too (the
# tests do the same, test/support/tools.ts).
export PATH="$PATH:/usr/sbin:/sbin"
have_tool() {
  case "$1" in
    # The console tests take CHROMIUM_PATH first, then Debian's /usr/bin/chromium.
    chromium) { [ -n "${CHROMIUM_PATH:-}" ] && [ -x "$CHROMIUM_PATH" ]; } || [ -x /usr/bin/chromium ] ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

missing_packages=()
missing_tools=()
for pair in "${wanted[@]}"; do
  tool=${pair%%:*}
  package=${pair#*:}
  if ! have_tool "$tool"; then
    missing_tools+=("$tool")
    missing_packages+=("$package")
  fi
done

if [ ${#missing_packages[@]} -gt 0 ]; then
  say "missing: ${missing_tools[*]}; installing Debian's ${missing_packages[*]}"
  # apt_install exits on failure; run it in a subshell so a machine where it cannot work
  # still gets the sentence below and, without --strict, the rest of the suite.
  if (apt_install provision "${missing_packages[@]}"); then
    for pair in "${wanted[@]}"; do
      tool=${pair%%:*}
      if ! have_tool "$tool"; then
        say "Debian's ${pair#*:} is installed but $tool is not on PATH: the tests that use it will fail" >&2
        [ "$strict" = 1 ] && exit 1
      fi
    done
  else
    say "could not install ${missing_packages[*]}: the tests that use ${missing_tools[*]} will fail until you run, as root: apt-get update && apt-get install -y --no-install-recommends ${missing_packages[*]}" >&2
    [ "$strict" = 1 ] && exit 1
  fi
fi
for pair in "${wanted[@]}"; do
  tool=${pair%%:*}
  have_tool "$tool" || continue
  case "$tool" in
    haproxy) say "$(haproxy -v 2>&1 | head -n 1)" ;;
    chromium) say "$("${CHROMIUM_PATH:-/usr/bin/chromium}" --version 2>/dev/null | head -n 1)" ;;
    promtool | amtool) say "$("$tool" --version 2>&1 | head -n 1)" ;;
    cmake | g++ | git) say "$("$tool" --version 2>&1 | head -n 1)" ;;
  esac
done

# The real llama-server. Run from the sources (tsx) so that it needs no dist/ yet.
# --no-bundled: the tests run the bundled engine on node-llama-cpp's prebuilt binary, the
# one every install has (`llmgw engine build` without it also compiles one for this CPU,
# which the engine benchmark measures; see bench/engine/README.md).
if [ "${LLMGW_SKIP_LLAMA_SERVER_BUILD:-}" = 1 ]; then
  say "LLMGW_SKIP_LLAMA_SERVER_BUILD=1: no llama-server build; the tests that run the real llama-server will fail"
elif llama_server=$(LLMGW_FROM_SOURCE=1 node bin/llmgw.js engine build --no-bundled); then
  say "llama-server: $llama_server"
else
  say "could not build llama-server (see the lines above): the tests that run the real llama-server will fail until \`llmgw engine build\` succeeds" >&2
  [ "$strict" = 1 ] && exit 1
fi

# PostgreSQL. Node's own client decides reachability (the same driver the tests use), with a
# deadline, so a silent port cannot hang the run.
postgres_url=${LLMGW_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
postgres_answers() {
  node --input-type=module -e '
    import pg from "pg";
    const client = new pg.Client({ connectionString: process.argv[1], connectionTimeoutMillis: 5000 });
    client.on("error", () => {});
    try { await client.connect(); await client.query("select 1"); await client.end(); process.exit(0); }
    catch (error) { console.error(error instanceof Error ? error.message : String(error)); process.exit(1); }
  ' "$postgres_url" 2>"$postgres_error"
}
postgres_error=$(mktemp)
trap 'rm -f "$postgres_error"' EXIT
if postgres_answers; then
  say "PostgreSQL answers at ${postgres_url%%\?*}"
else
  # An installed cluster that is merely stopped is started the way this machine kind starts it.
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ] && [ "$(id -u)" -eq 0 ]; then
    for version in /etc/postgresql/*; do
      [ -d "$version/main" ] && pg_ctlcluster --skip-systemctl-redirect "$(basename "$version")" main start >/dev/null 2>&1 || true
    done
  fi
  if postgres_answers; then
    say "PostgreSQL started; it answers at ${postgres_url%%\?*}"
  elif [ "${LLMGW_REQUIRE_POSTGRES:-}" = 1 ]; then
    say "FAILED: PostgreSQL does not answer at ${postgres_url%%\?*} ($(head -c 300 "$postgres_error")), and LLMGW_REQUIRE_POSTGRES=1 requires its store tests to run. Start PostgreSQL (Debian: apt-get install postgresql, then pg_ctlcluster <version> main start) with trust auth for the postgres role on 127.0.0.1 and a database named test, or point LLMGW_TEST_POSTGRES at one." >&2
    exit 1
  else
    say "PostgreSQL does not answer at ${postgres_url%%\?*} ($(head -c 300 "$postgres_error")): its store tests will be skipped (set LLMGW_TEST_POSTGRES to use another server)"
  fi
fi
