#!/usr/bin/env bash
# Checks the monitoring files in deploy/ with the tools that will read them: promtool
# (Prometheus config, alert rules and their unit tests), amtool (Alertmanager config and
# its routing) and a JSON parse of the Grafana dashboard. CI runs this before the tests
# (.ci/run), after scripts/provision.sh installed Debian's `prometheus` and
# `prometheus-alertmanager` packages, which carry promtool and amtool.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  printf '\ncheck-monitoring: FAILED: %s\n' "$1" >&2
  exit 1
}

command -v promtool >/dev/null 2>&1 || fail "promtool is not installed; run scripts/provision.sh (as root) or apt-get install -y prometheus"
command -v amtool >/dev/null 2>&1 || fail "amtool is not installed; run scripts/provision.sh (as root) or apt-get install -y prometheus-alertmanager"
echo "check-monitoring: $(promtool --version 2>&1 | head -n 1)"
echo "check-monitoring: $(amtool --version 2>&1 | head -n 1)"

# `promtool check config` also checks that the scrape's credentials_file exists. The real
# key file is the operator's secret and is not in the repository (.gitignore), so the
# config is checked in a copy of its folder with a placeholder key next to it.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp deploy/prometheus/*.yml "$work/"
printf 'placeholder-for-the-check' >"$work/llmgw-metrics.key"
promtool check config "$work/prometheus.yml" || fail "promtool does not accept deploy/prometheus/prometheus.yml (or the rule files it names); see above"
promtool check rules deploy/prometheus/alerts.yml || fail "promtool does not accept deploy/prometheus/alerts.yml; see above"
promtool test rules deploy/prometheus/alerts.test.yml || fail "the alert rules' unit tests (deploy/prometheus/alerts.test.yml) failed; see above"

amtool check-config deploy/alertmanager/alertmanager.yml || fail "amtool does not accept deploy/alertmanager/alertmanager.yml; see above"
# The routing the config's comments promise: severity decides the receiver.
route() {
  local receiver=$1
  shift
  amtool config routes test --config.file=deploy/alertmanager/alertmanager.yml --verify.receivers="$receiver" "$@" 2>/dev/null \
    || fail "deploy/alertmanager/alertmanager.yml does not route {$*} to $receiver"
}
route llmgw-critical alertname=LlmgwModelParked severity=critical model=chat
route llmgw-warnings alertname=LlmgwNodeLost severity=warning node=gpu-01
route llmgw-warnings alertname=LlmgwBudgetNearLimit severity=warning key=team-a

# The dashboard must parse, and each panel's query must be PromQL that promtool accepts:
# they become recording rules of a throwaway rule file (JSON is YAML), with Grafana's
# variables replaced by values a query could have.
node -e '
  const fs = require("node:fs");
  const dashboard = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  const rules = [];
  const visit = (panel) => {
    for (const target of panel.targets ?? []) {
      const expr = target.expr.replaceAll("$__rate_interval", "1m").replaceAll("$model", ".*");
      rules.push({ record: `dashboard_panel_${panel.id}_${target.refId}`, expr });
    }
    for (const inner of panel.panels ?? []) visit(inner);
  };
  for (const panel of dashboard.panels) visit(panel);
  if (rules.length === 0) throw new Error("the dashboard has no queries");
  fs.writeFileSync(process.argv[2], JSON.stringify({ groups: [{ name: "dashboard", rules }] }));
' deploy/grafana/llmgw-dashboard.json "$work/dashboard-queries.yml" \
  || fail "deploy/grafana/llmgw-dashboard.json is not valid JSON, or a panel has a target without expr"
promtool check rules "$work/dashboard-queries.yml" >/dev/null || fail "a query of deploy/grafana/llmgw-dashboard.json is not valid PromQL; promtool's error above names it as dashboard_panel_<panel id>_<refId>"

echo "check-monitoring: deploy/ passed promtool, amtool and the dashboard's query check"
