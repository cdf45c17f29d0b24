#!/usr/bin/env bash
# prometheus.sh start|stop|wipe - metrics on the local cluster, run directly (no systemd):
#   Debian's prometheus on 127.0.0.1:9090 (its default port), Debian's
#   prometheus-node-exporter on 127.0.0.1:9100, gpuhpc's Slurm exporter on :9410 and one
#   gpuhpc GPU exporter per fake GPU node (gpu-node1 :9411, gpu-node2 :9412, mig-node1 :9413)
#   on the NVML stand-in of the tests (tests/standins/nvml_standin.py, not in the gpuhpc package; state
#   files $D/nvml/<node>.json, built from tests/fixtures/nvidia-smi).
# The job map the Prolog/Epilog hook writes is $D/jobmap. Scrape and rule interval: $SCRAPE (5s).
# The rules are the monitoring role's template with `for: $IDLE_FOR` (20s) for the waste alert.
# Debian's prometheus-alertmanager (0.25) on 127.0.0.1:$AM_PORT (9093), Prometheus' alerting target:
#   alerts go nowhere except those with a `gpuhpc_test` label, which go to a webhook on
#   127.0.0.1:$WEBHOOK_PORT (9096) that a test listens on (tests/integration/monitoring/test_alerting.py).
#   The scrape job `probe` reads its targets from $D/probe-targets.json (file_sd; made empty):
#   a test points it at a closed port and the real GpuhpcTargetDown rule (`for: $TARGET_DOWN_FOR`, 0s) fires.
# `start` on a running set re-renders the rules and config and reloads Prometheus and Alertmanager (SIGHUP);
#   it restarts the gpuhpc exporters whose code (gpuhpc/monitoring, gpuhpc/slurm or tests/standins) changed
#   since they started.
# `start` prints the environment the monitoring tests read.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${D:-/var/tmp/gpuhpc-prometheus}; PORT=${PORT:-9090}; SCRAPE=${SCRAPE:-5s}; IDLE_FOR=${IDLE_FOR:-20s}
AM_PORT=${AM_PORT:-9093}; WEBHOOK_PORT=${WEBHOOK_PORT:-9096}; TARGET_DOWN_FOR=${TARGET_DOWN_FOR:-0s}
# root runs this and `stop` signals the pids under $D, the Prolog writes $D/jobmap: refuse a $D
# that another user made or can write (lib.sh), for every subcommand
. scripts/services/lib.sh
private_dir "$D" 755
PY=${PY:-$PWD/.venv/bin/python}
FIXTURES=$PWD/tests/fixtures   # the real nvidia-smi captures, in the repository
STANDINS=(env "PYTHONPATH=$PWD/tests${PYTHONPATH:+:$PYTHONPATH}")   # tests/standins: import standins.nvml_standin
NODES=(gpu-node1 gpu-node2 mig-node1)
alive() { [ -s "$D/$1.pid" ] && kill -0 "$(cat "$D/$1.pid")" 2>/dev/null; }
launch() {  # name, then the command
  local name=$1; shift
  alive "$name" && return 0
  setsid "$@" > "$D/$name.log" 2>&1 < /dev/null &
  echo $! > "$D/$name.pid"
}
refresh() {  # name, then its code's directories: an exporter started before its code last changed is
  # stopped (`launch` starts it again)
  local name=$1; shift
  alive "$name" && [ -n "$(find "$@" -name '*.py' -newer "$D/$name.pid" -print -quit)" ] || return 0
  set -- "$name"
  local pid; pid=$(cat "$D/$1.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$D/$1.pid"
}
wait_http() {  # name url
  for _ in $(seq 300); do
    curl -sf -o /dev/null "$2" && return 0
    alive "$1" || { tail -20 "$D/$1.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "$1 did not answer at $2" >&2; exit 1
}
stop_all() {
  for f in "$D"/*.pid; do
    [ -e "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
}
case "${1:-start}" in
start)
  mkdir -p "$D/data" "$D/nvml" "$D/jobmap" "$D/alertmanager"
  # the probe targets (a test's own, which it removes): kept by a `start` that runs during that test.
  # "No targets" is one empty group, not `[]`: a file_sd provider restarted by a reload that reads `[]`
  # leaves the previous provider's targets in place; an empty group under the same source replaces them.
  [ -e "$D/probe-targets.json" ] || echo '[{"targets": []}]' > "$D/probe-targets.json"
  "${STANDINS[@]}" "$PY" -m standins.nvml_standin local-cluster "$FIXTURES" "$D/nvml"
  # the rules the monitoring role installs, rendered with its defaults except a short `for:` (IDLE_FOR),
  # so that the waste alert fires within a test; production keeps the role's 10m
  "$PY" - "$D/rules.yml" "$IDLE_FOR" "$TARGET_DOWN_FOR" <<'PYEOF'
import sys, jinja2, yaml
role = "ansible/roles/gpuhpc_monitoring"
env = jinja2.Environment(loader=jinja2.FileSystemLoader(f"{role}/templates"), undefined=jinja2.StrictUndefined,
                         keep_trailing_newline=True)
variables = yaml.safe_load(open(f"{role}/defaults/main.yml"))
variables.update(ansible_managed="rendered by scripts/services/prometheus.sh", gpuhpc_monitoring_idle_for=sys.argv[2],
                 gpuhpc_monitoring_target_down_for=sys.argv[3])
open(sys.argv[1], "w").write(env.get_template("gpuhpc-rules.yml.j2").render(**variables))
PYEOF
  /usr/bin/promtool check rules "$D/rules.yml" > /dev/null
  cat > "$D/alertmanager.yml" <<AMEOF
route:
  receiver: none
  group_by: [alertname, instance]
  routes:
    - matchers: ['gpuhpc_test=~".+"']
      receiver: test-webhook
      group_by: [alertname, gpuhpc_test]
      group_wait: 0s
      group_interval: 1s
      repeat_interval: 1h
receivers:
  - name: none
  - name: test-webhook
    webhook_configs:
      - url: http://127.0.0.1:$WEBHOOK_PORT/alert
        send_resolved: true
AMEOF
  /usr/bin/amtool check-config "$D/alertmanager.yml" > /dev/null
  {
    echo "global: {scrape_interval: $SCRAPE, evaluation_interval: $SCRAPE}"
    echo "rule_files: [$D/rules.yml, $PWD/gpuhpc/monitoring/prometheus/rules-long-range.yml]"
    echo "alerting: {alertmanagers: [{static_configs: [{targets: ['127.0.0.1:$AM_PORT']}]}]}"
    echo "scrape_configs:"
    # the local nodes all run on this host: its node exporter is each one's (labelled as the role labels them)
    echo "  - job_name: node"
    echo "    static_configs:"
    for n in "$(hostname -s)" "${NODES[@]}" cpu-node1; do echo "      - {targets: ['127.0.0.1:9100'], labels: {node: $n}}"; done
    echo "  - {job_name: slurm, static_configs: [{targets: ['127.0.0.1:9410']}]}"
    # refresh_interval: read every 5 s as well as on change (a reload can lose the file watch)
    echo "  - {job_name: probe, file_sd_configs: [{files: ['$D/probe-targets.json'], refresh_interval: 5s}]}"
    echo "  - job_name: gpu"
    echo "    honor_labels: true"
    echo "    static_configs:"
    port=9411
    for n in "${NODES[@]}"; do echo "      - {targets: ['127.0.0.1:$port'], labels: {node: $n}}"; port=$((port + 1)); done
  } > "$D/prometheus.yml"
  launch node-exporter /usr/bin/prometheus-node-exporter --web.listen-address=127.0.0.1:9100
  refresh slurm-exporter gpuhpc/monitoring gpuhpc/slurm
  launch slurm-exporter "$PY" -m gpuhpc.monitoring.slurm_exporter --port 9410
  port=9411
  for n in "${NODES[@]}"; do
    refresh "gpu-exporter-$n" gpuhpc/monitoring tests/standins
    GPUHPC_NVML_STANDIN="$D/nvml/$n.json" GPUHPC_JOBMAP_DIR="$D/jobmap" GPUHPC_NVML_MODULE=standins.nvml_standin \
      launch "gpu-exporter-$n" "${STANDINS[@]}" "$PY" -m gpuhpc.monitoring.gpu_exporter --node "$n" --port $port
    port=$((port + 1))
  done
  alive alertmanager && kill -HUP "$(cat "$D/alertmanager.pid")"  # already up: reload its config
  launch alertmanager /usr/bin/prometheus-alertmanager --config.file="$D/alertmanager.yml" \
    --storage.path="$D/alertmanager" --web.listen-address=127.0.0.1:$AM_PORT --cluster.listen-address=
  alive prometheus && kill -HUP "$(cat "$D/prometheus.pid")"     # already up: reload rules and config
  launch prometheus /usr/bin/prometheus --config.file="$D/prometheus.yml" --storage.tsdb.path="$D/data" \
    --web.listen-address=127.0.0.1:$PORT --storage.tsdb.retention.time=7d
  wait_http node-exporter http://127.0.0.1:9100/metrics
  wait_http slurm-exporter http://127.0.0.1:9410/metrics
  port=9411
  for n in "${NODES[@]}"; do wait_http "gpu-exporter-$n" "http://127.0.0.1:$port/metrics"; port=$((port + 1)); done
  wait_http alertmanager "http://127.0.0.1:$AM_PORT/-/ready"
  wait_http prometheus "http://127.0.0.1:$PORT/-/ready"
  echo "GPUHPC_PROMETHEUS_URL=http://127.0.0.1:$PORT GPUHPC_NVML_STATE_DIR=$D/nvml GPUHPC_JOBMAP_DIR=$D/jobmap" \
    "GPUHPC_ALERTMANAGER_URL=http://127.0.0.1:$AM_PORT GPUHPC_ALERT_WEBHOOK_PORT=$WEBHOOK_PORT" \
    "GPUHPC_ALERT_PROBE_FILE=$D/probe-targets.json"
  ;;
stop) stop_all ;;
wipe) stop_all; rm -rf "$D" ;;
*) echo "usage: $0 start|stop|wipe" >&2; exit 2 ;;
esac
