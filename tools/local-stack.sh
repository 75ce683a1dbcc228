#!/usr/bin/env bash
# The whole Krane stack on one machine, in the foreground: a scratch MariaDB, krane-ctrl, and one
# agent per region (local-1, local-2) on the process runtime. krane-ctrl and the agents run
# supervised (tools/supervise.sh): one that exits is restarted with a growing delay (1 s doubling
# to 30 s, back to 1 s after a minute up), with an `up:` line naming it, its exit status and the
# delay. Ctrl-C (or SIGTERM) stops everything, in reverse order, and nothing is left running.
#
# Everything lives under .krane-local/ in the source tree: the database, the logs, the agents'
# state directories and the instances' working directories; run/ holds the pid of each running
# process. `.krane-local/env` holds what kranectl needs (KRANE_SERVER, KRANE_TOKEN); it is written
# once the stack is ready.
#
# Called by `./dev up` and `./dev demo` after the binaries are built (BIN: Bazel's bin folder).
# The environment can move it: KRANE_LOCAL_DIR, KRANE_DB_PORT, KRANE_GRPC_PORT, KRANE_HTTP_PORT,
# KRANE_WATCH_PORT (krane-ctrl's watch listener, where local-2's agent watches), KRANE_INSTANCE_PORT (first port of the instances' ranges), and the supervisor's KRANE_UP_*
# settings (tools/supervise.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BIN:-$ROOT/.bazel/bin}"
LOCAL="${KRANE_LOCAL_DIR:-$ROOT/.krane-local}"
DB_PORT="${KRANE_DB_PORT:-17306}"
GRPC_PORT="${KRANE_GRPC_PORT:-17070}"
HTTP_PORT="${KRANE_HTTP_PORT:-17071}"
WATCH_PORT="${KRANE_WATCH_PORT:-17073}"
INSTANCE_PORT="${KRANE_INSTANCE_PORT:-18000}"
REGIONS=(local-1 local-2)

say() { printf 'up: %s\n' "$*" >&2; }
die() { printf 'up: error: %s\n' "$*" >&2; exit 1; }

# shellcheck source=tools/supervise.sh
source "$(dirname "${BASH_SOURCE[0]}")/supervise.sh"
STOP_GRACE_S="${KRANE_UP_STOP_GRACE_S:-10}"

PIDS=()   # supervisors, in start order
NAMES=()
PIDFILES=()  # each supervisor's file with the pid of what it runs

# Stops every instance of the process runtime that is still running: those of an agent that was
# down (waiting for its restart) when the stack stopped. A running agent stops its own.
stop_left_instances() {
  local record pid ticks now
  while IFS= read -r record; do
    pid="$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$record" 2>/dev/null)"
    ticks="$(sed -n 's/.*"start_ticks": *\([0-9]*\).*/\1/p' "$record" 2>/dev/null)"
    [ "${pid:-0}" -gt 0 ] && [ -r "/proc/$pid/stat" ] || continue
    # The same process, not a later one that got its pid: field 22 of stat is its start time.
    now="$(sed -e 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20)"
    [ "$now" = "$ticks" ] || continue
    say "stopping instance $(basename "$(dirname "$record")") (pid $pid) left by a stopped agent"
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done < <(find "$LOCAL/agents" -name instance.json 2>/dev/null)
}

stop_all() {
  trap - INT TERM EXIT
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    local pid="${PIDS[$i]}" child
    child="$(cat "${PIDFILES[$i]}" 2>/dev/null || true)"
    if kill -0 "$pid" 2>/dev/null; then
      say "stopping ${NAMES[$i]}${child:+ (pid $child)}"
      kill -TERM "$pid" 2>/dev/null || true
      # The supervisor gives what it runs STOP_GRACE_S, then kills it; this is in case it hangs.
      for _ in $(seq 1 $(((STOP_GRACE_S + 5) * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
    # A supervisor that stopped cleanly removed its pid file; one that had to be killed did not.
    child="$(cat "${PIDFILES[$i]}" 2>/dev/null || true)"
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then kill -KILL "$child" 2>/dev/null || true; fi
    rm -f "${PIDFILES[$i]}"
  done
  stop_left_instances
  if [ -f "$LOCAL/mariadb/mysqld.pid" ]; then
    local pid
    pid="$(cat "$LOCAL/mariadb/mysqld.pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      say "stopping MariaDB (pid $pid)"
      kill -TERM "$pid"
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  fi
  rm -f "$LOCAL/env"
  say "stopped; logs are in $LOCAL/logs"
}

start() {  # NAME LOG COMMAND...: runs COMMAND supervised
  local name="$1" log="$2" pidfile
  shift 2
  pidfile="$LOCAL/run/${name// /-}.pid"
  supervise "$name" "$log" "$pidfile" "$@"
  PIDS+=("$SUPERVISOR_PID")
  NAMES+=("$name")
  PIDFILES+=("$pidfile")
}

wait_for() {  # WHAT SECONDS COMMAND...
  local what="$1" seconds="$2"
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then die "$what did not come up within ${seconds}s"; fi
    sleep 0.2
  done
}

for b in controlplane/krane-ctrl agent/krane agent/krane-plugin-host cli/kranectl \
         plugins/deployment/libdeployment.so plugins/sentinel/libsentinel.so \
         plugins/sentinel/krane-sentinel tests/support/demo_app/krane-demo-app; do
  [ -e "$BIN/$b" ] || die "$BIN/$b is missing: build first (./dev up does)"
done
command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || die "mariadbd not found: run ./dev setup"

if [ -f "$LOCAL/mariadb/mysqld.pid" ] && kill -0 "$(cat "$LOCAL/mariadb/mysqld.pid")" 2>/dev/null; then
  die "a stack already runs from $LOCAL (MariaDB pid $(cat "$LOCAL/mariadb/mysqld.pid")); stop it first"
fi
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$LOCAL/logs" "$LOCAL/mariadb" "$LOCAL/run"
rm -f "$LOCAL/env" "$LOCAL"/run/*.pid

# --- MariaDB -----------------------------------------------------------------------------------
if [ ! -d "$LOCAL/mariadb/data/mysql" ]; then
  say "creating the database in $LOCAL/mariadb"
  mariadb-install-db --no-defaults --user="$(id -un)" --datadir="$LOCAL/mariadb/data" \
    --auth-root-authentication-method=normal --skip-test-db --innodb-log-file-size=8M \
    >"$LOCAL/logs/mariadb-install.log" 2>&1 || die "mariadb-install-db failed: see $LOCAL/logs/mariadb-install.log"
fi
say "starting MariaDB on 127.0.0.1:$DB_PORT"
MARIADBD="$(command -v mariadbd || echo /usr/sbin/mariadbd)"
"$MARIADBD" --no-defaults --user="$(id -un)" --datadir="$LOCAL/mariadb/data" \
  --socket="$LOCAL/mariadb/mysqld.sock" --port="$DB_PORT" --bind-address=127.0.0.1 \
  --pid-file="$LOCAL/mariadb/mysqld.pid" --log-error="$LOCAL/logs/mariadb.err" \
  --innodb-log-file-size=8M --skip-name-resolve >/dev/null 2>&1 &
wait_for "MariaDB" 60 mariadb --no-defaults -uroot -h127.0.0.1 -P"$DB_PORT" -e "SELECT 1"
mariadb --no-defaults -uroot -h127.0.0.1 -P"$DB_PORT" \
  -e "CREATE DATABASE IF NOT EXISTS krane CHARACTER SET utf8mb4"
export KRANE_DSN="mysql://root@127.0.0.1:$DB_PORT/krane"

# --- krane-ctrl --------------------------------------------------------------------------------
CTRL="$BIN/controlplane/krane-ctrl"
"$CTRL" migrate --dsn "$KRANE_DSN" >>"$LOCAL/logs/migrate.log" 2>&1 || die "migrations failed: see $LOCAL/logs/migrate.log"
for region in "${REGIONS[@]}"; do
  "$CTRL" region add "$region" --dsn "$KRANE_DSN" >/dev/null
  if [ ! -s "$LOCAL/$region.token" ]; then
    "$CTRL" token create --region "$region" --name "local agent" --dsn "$KRANE_DSN" \
      | tail -n 1 | tr -d '[:space:]' >"$LOCAL/$region.token"
  fi
done
if [ ! -s "$LOCAL/operator.token" ]; then
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$LOCAL/operator.token"
fi
cat >"$LOCAL/ctrl.yaml" <<YAML
listen: 127.0.0.1:$GRPC_PORT
http_listen: 127.0.0.1:$HTTP_PORT
database:
  dsn: $KRANE_DSN
auth:
  operator_tokens_file: $LOCAL/operator.token
deploy:
  build_log_dir: $LOCAL/builds
feed:
  watch_listen: 127.0.0.1:$WATCH_PORT
YAML
say "starting krane-ctrl on 127.0.0.1:$GRPC_PORT (metrics on :$HTTP_PORT)"
start krane-ctrl "$LOCAL/logs/krane-ctrl.log" "$CTRL" serve --config "$LOCAL/ctrl.yaml"
wait_for "krane-ctrl" 60 curl -fsS "http://127.0.0.1:$HTTP_PORT/readyz"

# --- agents ------------------------------------------------------------------------------------
DEMO_APP="$BIN/tests/support/demo_app/krane-demo-app"
SENTINEL="$BIN/plugins/sentinel/krane-sentinel"
port="$INSTANCE_PORT"
for region in "${REGIONS[@]}"; do
  state="$LOCAL/agents/$region"
  mkdir -p "$state"
  cat >"$LOCAL/agent-$region.yaml" <<YAML
region: $region
agent_id: $region-agent
state_dir: $state
control_plane:
  address: 127.0.0.1:$GRPC_PORT
  token_file: $LOCAL/$region.token
$([ "$region" != local-1 ] || printf '  watch_address: off  # Watch on the gRPC port (local-2 follows krane-ctrl to its watch listener)\n')
reporter:
  heartbeat_interval_ms: 2000
plugins:
  - name: deployment
    path: $BIN/plugins/deployment/libdeployment.so
    config:
      runtime: process
      process:
        state_dir: $state/deployments
        stop_instances_on_shutdown: true
        ports: {from: $port, to: $((port + 99))}
        images:
          krane.dev/demo-app: [$DEMO_APP, --version, "{tag}"]
  - name: sentinel
    path: $BIN/plugins/sentinel/libsentinel.so
    config:
      runtime: process
      process:
        state_dir: $state/sentinels
        stop_instances_on_shutdown: true
        ports: {from: $((port + 100)), to: $((port + 199))}
        # The routing proxy reads the addresses the deployment plugin publishes.
        routes: {deployment_state_dir: $state/deployments}
        images:
          krane.dev/sentinel: [$SENTINEL, --version, "{tag}", --host, 127.0.0.1]
YAML
  if [ -e "$BIN/plugins/cilium/libcilium.so" ]; then
    cat >>"$LOCAL/agent-$region.yaml" <<YAML
  - name: cilium
    path: $BIN/plugins/cilium/libcilium.so
    config:
      runtime: process
      process:
        state_dir: $state/cilium
YAML
  fi
  say "starting the agent of $region (instances on ports $port-$((port + 199)))"
  start "agent $region" "$LOCAL/logs/agent-$region.log" \
    "$BIN/agent/krane" run --config "$LOCAL/agent-$region.yaml" --plugin-host "$BIN/agent/krane-plugin-host"
  port=$((port + 200))
done

KRANECTL=("$BIN/cli/kranectl" --server "127.0.0.1:$GRPC_PORT" --token-file "$LOCAL/operator.token")
agents_up() {
  local out
  out="$("${KRANECTL[@]}" agents -o json 2>/dev/null)" || return 1
  for region in "${REGIONS[@]}"; do grep -q "\"region\": \"$region\"" <<<"$out" || return 1; done
}
wait_for "the agents" 60 agents_up

# Written whole, then renamed: whoever waits for the file never reads half of it.
cat >"$LOCAL/env.tmp" <<ENV
export KRANE_SERVER=127.0.0.1:$GRPC_PORT
export KRANE_TOKEN=$(cat "$LOCAL/operator.token")
export PATH="$BIN/cli:\$PATH"
ENV
mv "$LOCAL/env.tmp" "$LOCAL/env"
cat >&2 <<INFO

Krane is running.
  krane-ctrl     grpc 127.0.0.1:$GRPC_PORT, metrics http://127.0.0.1:$HTTP_PORT/metrics,
                 watch listener 127.0.0.1:$WATCH_PORT (local-2's agent watches there, local-1's on grpc)
  MariaDB        $KRANE_DSN
  agents         ${REGIONS[*]} (process runtime), state under $LOCAL/agents
  logs           $LOCAL/logs

In another terminal:
  source $LOCAL/env
  kranectl agents
  kranectl apply -f examples/demo-app.yaml
  kranectl status deployment demo --region local-1 --wait

krane-ctrl and the agents are restarted when they exit (pids in $LOCAL/run).
Ctrl-C stops everything.
INFO

# Stay in the foreground until interrupted. The supervisors restart what they run; MariaDB is not
# supervised, and without it nothing works: its end stops the stack.
MARIADB_PID="$(cat "$LOCAL/mariadb/mysqld.pid" 2>/dev/null || true)"
while true; do
  for i in "${!PIDS[@]}"; do
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
      die "the supervisor of ${NAMES[$i]} exited; see $LOCAL/logs"
    fi
  done
  if [ -n "$MARIADB_PID" ] && ! kill -0 "$MARIADB_PID" 2>/dev/null; then
    die "MariaDB (pid $MARIADB_PID) exited; see $LOCAL/logs/mariadb.err"
  fi
  sleep 1
done
