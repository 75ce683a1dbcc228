#!/usr/bin/env bash
# ./dev demo: bring the local stack up, deploy the example app (examples/demo-app.yaml: the demo
# app with 3 replicas in each of two regions, plus a sentinel per region), wait until healthy,
# request every instance, scale it, roll it to a new version, delete it; then deploy it as a
# workflow with kranectl deploy (two versions, rollback, promote, a failing build, a cancelled
# deploy waiting for the build slot); print each agent's lag, and stop the stack. Exits 0 only if every step
# converged.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BIN:-$ROOT/.bazel/bin}"
# The demo starts from nothing every time: its own database and state, away from ./dev up's.
LOCAL="${KRANE_LOCAL_DIR:-$ROOT/.krane-local/demo}"
export KRANE_LOCAL_DIR="$LOCAL"
REGIONS=(local-1 local-2)
EXAMPLE="$ROOT/examples/demo-app.yaml"
WAIT_S="${KRANE_DEMO_WAIT_S:-120}"

STARTED=$SECONDS
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'demo: FAILED: %s\n' "$*" >&2; exit 1; }

# --- the stack ---------------------------------------------------------------------------------
if [ -f "$LOCAL/mariadb/mysqld.pid" ] && kill -0 "$(cat "$LOCAL/mariadb/mysqld.pid")" 2>/dev/null; then
  die "a demo already runs (MariaDB pid $(cat "$LOCAL/mariadb/mysqld.pid"))"
fi
rm -rf "$LOCAL"
mkdir -p "$LOCAL/logs"
step "Starting the stack: MariaDB, krane-ctrl, an agent for each of ${REGIONS[*]}"
STACK_PID=""
TRAFFIC_PID=""
stop_stack() {
  [ -z "$TRAFFIC_PID" ] || kill "$TRAFFIC_PID" 2>/dev/null || true
  if [ -n "$STACK_PID" ] && kill -0 "$STACK_PID" 2>/dev/null; then
    step "Stopping the stack"
    # A background job ignores SIGINT in a script: TERM, which the stack handles the same way.
    kill -TERM "$STACK_PID" 2>/dev/null || true
    wait "$STACK_PID" 2>/dev/null || true
  fi
}
trap stop_stack EXIT
"$ROOT/tools/local-stack.sh" >"$LOCAL/logs/stack.log" 2>&1 &
STACK_PID=$!
for _ in $(seq 1 600); do
  [ -f "$LOCAL/env" ] && break
  kill -0 "$STACK_PID" 2>/dev/null || { cat "$LOCAL/logs/stack.log" >&2; die "the stack did not start"; }
  sleep 0.2
done
[ -f "$LOCAL/env" ] || die "the stack was not ready within 120s (see $LOCAL/logs)"
# shellcheck disable=SC1091
source "$LOCAL/env"
KRANECTL="$BIN/cli/kranectl"
kranectl() { "$KRANECTL" "$@"; }
kranectl agents

# Waits for every resource of the app to converge in every region.
wait_converged() {
  local region
  for region in "${REGIONS[@]}"; do
    kranectl status deployment demo --region "$region" --wait --timeout "$WAIT_S" ||
      die "deployment demo did not converge in $region"
    kranectl status sentinel "sentinel-demo-$region" --region "$region" --wait --timeout "$WAIT_S" ||
      die "sentinel sentinel-demo-$region did not converge in $region"
  done
}

# Prints what every instance answers on / and checks it names `version` ($1) and the count ($2).
request_all() {
  local version="$1" expected="$2" region addresses address answer count=0
  for region in "${REGIONS[@]}"; do
    addresses="$(kranectl status deployment demo --region "$region" -o json |
      sed -n 's/.*"address": *"\([^"]*\)".*/\1/p')"
    for address in $addresses; do
      answer="$(curl -fsS --max-time 2 "http://$address/")" || die "$address did not answer"
      printf '  %-8s %-16s %s\n' "$region" "$address" "$answer"
      case "$answer" in *" $version "*) ;; *) die "$address answers \"$answer\", expected $version" ;; esac
      count=$((count + 1))
    done
  done
  [ "$count" -eq "$expected" ] || die "$count instances answered, expected $expected"
}

# --- the app -----------------------------------------------------------------------------------
step "Applying $(realpath --relative-to="$ROOT" "$EXAMPLE"): demo x3 and a sentinel, in each region"
kranectl apply -f "$EXAMPLE"
step "Waiting until every instance is healthy"
wait_converged
step "Requesting every instance"
request_all v1 6

step "Scaling to 5 replicas per region"
sed -e 's/^  replicas: 3$/  replicas: 5/' "$EXAMPLE" >"$LOCAL/demo-app-scaled.yaml"
kranectl apply -f "$LOCAL/demo-app-scaled.yaml"
wait_converged
request_all v1 10

step "Rolling to version v2 (one new instance at a time, never below 5 ready)"
sed -e 's/^  replicas: 3$/  replicas: 5/' -e 's|krane.dev/demo-app:v1|krane.dev/demo-app:v2|' \
  "$EXAMPLE" >"$LOCAL/demo-app-v2.yaml"
kranectl apply -f "$LOCAL/demo-app-v2.yaml"
wait_converged
request_all v2 10

step "Deleting the app"
OLD_ADDRESSES=""
for region in "${REGIONS[@]}"; do
  OLD_ADDRESSES+=" $(kranectl status deployment demo --region "$region" -o json |
    sed -n 's/.*"address": *"\([^"]*\)".*/\1/p' | tr '\n' ' ')"
done
kranectl delete -f "$EXAMPLE"
for address in $OLD_ADDRESSES; do
  for _ in $(seq 1 $((WAIT_S * 5))); do
    curl -fsS --max-time 1 "http://$address/" >/dev/null 2>&1 || continue 2
    sleep 0.2
  done
  die "$address still answers after the delete"
done
echo "every instance stopped"
kranectl get

# --- deploys as workflows ---------------------------------------------------------------------
# Prints what the instances of deployment $1 answer and checks they name version $2.
request_deployment() {
  local dep="$1" version="$2" region address answer count=0
  for region in "${REGIONS[@]}"; do
    for address in $(kranectl status deployment "$dep" --region "$region" -o json |
      sed -n 's/.*"address": *"\([^"]*\)".*/\1/p'); do
      answer="$(curl -fsS --max-time 2 "http://$address/")" || die "$address did not answer"
      printf '  %-8s %-16s %s\n' "$region" "$address" "$answer"
      case "$answer" in *" $version "*) ;; *) die "$address answers \"$answer\", expected $version" ;; esac
      count=$((count + 1))
    done
  done
  [ "$count" -gt 0 ] || die "no instance of $dep answered"
}
# Runs kranectl deploy (its output shown as it comes) and prints the deployment's id last.
deploy() {
  kranectl deploy --app demo-app --env demo-prod --branch main --timeout "$WAIT_S" "$@" |
    tee "$LOCAL/deploy.out" >&2 || die "kranectl deploy $* failed"
  sed -n 's/^deployment \(dep_[0-9a-f]*\) created.*/\1/p' "$LOCAL/deploy.out"
}
live() { kranectl deployments list --app demo-app -o json | grep -B8 '"live": true' | sed -n 's/.*"id": "\(dep_[^"]*\)".*/\1/p'; }
# The environment whose sentinels the requests below go through (use_sentinels ENV).
declare -A SENTINEL_FILE
use_sentinels() {
  local region id
  for region in "${REGIONS[@]}"; do
    id="$(kranectl sentinels list --env "$1" --region "$region" -o json |
      sed -n 's/.*"id": "\([^"]*\)".*/\1/p' | head -1)"
    [ -n "$id" ] || die "environment $1 has no sentinel in $region"
    # (the runtime names the file after the workload, sentinel/<id>, and a hash of it)
    SENTINEL_FILE[$region]="$LOCAL/agents/$region/sentinels/endpoints/sentinel_$id-*.json"
  done
}
# The ready addresses of the sentinel in region $1, as its runtime publishes them.
sentinel_addresses() {
  # shellcheck disable=SC2086  # the pattern expands to the one file
  cat ${SENTINEL_FILE[$1]} 2>/dev/null | grep -o '"[0-9.]*:[0-9]*"' | tr -d '"'
}
# A request through the sentinel of region $1, to whichever of its instances answers first (as a
# load balancer in front of them would).
through_sentinel() {
  local address
  for address in $(sentinel_addresses "$1"); do
    curl -fsS --max-time 2 "http://$address/" 2>/dev/null && return 0
  done
  return 1
}
# Requests the app through each region's sentinel and checks the answers name version $1.
request_sentinels() {
  local region answer
  for region in "${REGIONS[@]}"; do
    answer="$(through_sentinel "$region")" || die "the sentinel of $region did not answer"
    printf '  %-8s through the sentinel: %s\n' "$region" "$answer"
    case "$answer" in *" $1 "*) ;; *) die "the sentinel of $region answers \"$answer\", expected $1" ;; esac
  done
}
# Steady traffic through both sentinels in the background, until stop_traffic; then the count
# of requests and of failures.
start_traffic() {
  : >"$LOCAL/traffic.log"
  (
    while [ ! -e "$LOCAL/traffic.stop" ]; do
      for region in "${REGIONS[@]}"; do
        if through_sentinel "$region" >/dev/null; then echo ok; else echo "FAIL $region"; fi
      done >>"$LOCAL/traffic.log"
      sleep 0.02
    done
  ) &
  TRAFFIC_PID=$!
}
stop_traffic() {
  touch "$LOCAL/traffic.stop"
  wait "$TRAFFIC_PID" 2>/dev/null || true
  rm -f "$LOCAL/traffic.stop"
  local total failed
  total="$(wc -l <"$LOCAL/traffic.log")"
  failed="$(grep -c FAIL "$LOCAL/traffic.log" || true)"
  echo "  $total requests through the sentinels during $1, $failed failed"
  [ "$failed" -eq 0 ] || die "$failed requests through the sentinels failed during $1"
  [ "$total" -gt 0 ] || die "no request went through the sentinels during $1"
}

step "Deploys as workflows: a workspace (one build at a time), project, app and environment"
kranectl create workspace "Demo" --id demo-ws --max-builds 1
kranectl create project "Demo" --id demo-proj --workspace demo-ws
kranectl create app "Demo app" --id demo-app --project demo-proj
kranectl create environment production --id demo-prod --app demo-app \
  --region local-1=2 --region local-2=2 --deploy-timeout "$WAIT_S"

step "kranectl deploy: version v1 to both regions, followed step by step"
DEP1="$(deploy --commit v1 --image krane.dev/demo-app:v1)"
request_deployment "$DEP1" v1
step "The first deploy gave each region the environment's sentinel and network policy"
for region in "${REGIONS[@]}"; do
  kranectl -o json get sentinel --region "$region" | grep -q '"environment_id": "demo-prod"' ||
    die "the deploy created no sentinel for demo-prod in $region"
  kranectl -o json get cnp --region "$region" | grep -q '"environment_id": "demo-prod"' ||
    die "the deploy created no network policy for demo-prod in $region"
done
kranectl get sentinel
kranectl get cnp
step "Requests through the sentinels reach the live deployment"
use_sentinels demo-prod
for _ in $(seq 1 $((WAIT_S * 10))); do  # the first routes take a moment to reach the proxies
  ok=1
  for region in "${REGIONS[@]}"; do
    case "$(through_sentinel "$region")" in *" v1 "*) ;; *) ok=0 ;; esac
  done
  [ "$ok" = 1 ] && break
  sleep 0.1
done
request_sentinels v1

step "kranectl deploy: version v2 goes live in its turn, traffic through the sentinels follows"
start_traffic
DEP2="$(deploy --commit v2 --image krane.dev/demo-app:v2)"
request_deployment "$DEP2" v2
[ "$(live)" = "$DEP2" ] || die "$DEP2 is not live"
sleep 1  # the routes reach the proxies within about half a second
request_sentinels v2
stop_traffic "the swap"

step "Rolling back: v1 is live again (and new deploys stay off the live routes until a promote)"
start_traffic
kranectl rollback --env demo-prod
[ "$(live)" = "$DEP1" ] || die "the rollback did not make $DEP1 live"
request_deployment "$DEP1" v1
sleep 1
request_sentinels v1
stop_traffic "the rollback"
kranectl deployments list --app demo-app

step "Promoting v2"
start_traffic
kranectl promote "$DEP2"
[ "$(live)" = "$DEP2" ] || die "the promote did not make $DEP2 live"
request_deployment "$DEP2" v2
sleep 1
request_sentinels v2
stop_traffic "the promote"

step "Cancelling a deploy that waits for the build slot (a failing build holds it)"
DEP3="$(kranectl deploy --app demo-app --env demo-prod --branch broken --commit v3 --no-wait \
  --image-name krane.dev/demo-app -- /bin/sh -c 'echo compiling v3; sleep 4; echo "error: v3 does not compile" >&2; exit 1' |
  sed -n 's/^deployment \(dep_[0-9a-f]*\) created.*/\1/p')"
for _ in $(seq 1 100); do
  kranectl deployments get "$DEP3" -o json | grep -q '"status": "building"' && break
  sleep 0.1
done
DEP4="$(kranectl deploy --app demo-app --env demo-prod --branch other --commit v4 --no-wait \
  --image krane.dev/demo-app:v4 | sed -n 's/^deployment \(dep_[0-9a-f]*\) created.*/\1/p')"
for _ in $(seq 1 100); do  # until it waits in the slot's queue
  kranectl deployments get "$DEP4" -o json | grep -q '"step": "queued"' && break
  sleep 0.1
done
kranectl deployments list --app demo-app
kranectl cancel "$DEP4"
await_status() {
  for _ in $(seq 1 $((WAIT_S * 10))); do
    kranectl deployments get "$1" -o json | grep -q "\"status\": \"$2\"" && return 0
    sleep 0.1
  done
  die "$1 did not end $2"
}
await_status "$DEP4" cancelled
kranectl deployments get "$DEP4"
await_status "$DEP3" failed
kranectl deployments get "$DEP3"
[ "$(live)" = "$DEP2" ] || die "$DEP2 is no longer live"

step "Fleet rollout: every sentinel to v2, wave by wave (half, then the rest), and back to v1, requests flowing through them"
start_traffic
kranectl rollout sentinels --image krane.dev/sentinel:v2 --waves 50,100 --watch ||
  die "the sentinel rollout to v2 did not complete"
kranectl sentinels list
! kranectl sentinels list -o json | grep '"running_image"' | grep -qv 'krane.dev/sentinel:v2' ||
  die "not every sentinel runs v2"
kranectl rollout sentinels --image krane.dev/sentinel:v1 --waves 50,100 --watch ||
  die "the sentinel rollout back to v1 did not complete"
kranectl rollout status
request_sentinels v2
stop_traffic "both sentinel rollouts"

step "A rolling deploy: app demo-rolling (3 replicas per region, surge 1, unavailable 0) moves from v1 to v2 replica by replica, requests flowing through its sentinels"
kranectl create app "Demo rolling" --id demo-rolling --project demo-proj
kranectl create environment production --id demo-rolling-prod --app demo-rolling \
  --region local-1=3 --region local-2=3 --strategy rolling --max-surge 1 --max-unavailable 0 \
  --deploy-timeout "$WAIT_S"
rolling_deploy() {
  kranectl deploy --app demo-rolling --env demo-rolling-prod --branch main --timeout "$WAIT_S" "$@" |
    tee "$LOCAL/deploy.out" >&2 || die "kranectl deploy $* failed"
  sed -n 's/^deployment \(dep_[0-9a-f]*\) created.*/\1/p' "$LOCAL/deploy.out"
}
RDEP1="$(rolling_deploy --commit v1 --image krane.dev/demo-app:v1)"  # the first starts in full
use_sentinels demo-rolling-prod
for _ in $(seq 1 $((WAIT_S * 10))); do
  case "$(through_sentinel local-1)$(through_sentinel local-2)" in *" v1 "*" v1 "*) break ;; esac
  sleep 0.1
done
request_sentinels v1
start_traffic
RDEP2="$(rolling_deploy --commit v2 --image krane.dev/demo-app:v2)"
sleep 1
request_sentinels v2
stop_traffic "the rolling deploy"
kranectl deployments get "$RDEP2"
echo "the topologies in local-1: $RDEP2 took over all 3 replicas of $RDEP1"
kranectl get deployment --region local-1 | grep -E "ID|$RDEP1|$RDEP2"

step "Agents and their lag"
for _ in $(seq 1 50); do
  lagging="$(kranectl agents -o json | grep -c '"lag": "[1-9]' || true)"
  [ "$lagging" -eq 0 ] && break
  sleep 0.2
done
kranectl agents
[ "$lagging" -eq 0 ] || die "an agent still lags behind its region"

stop_stack
STACK_PID=""
printf '\n\033[1mdemo: every step converged in %ds\033[0m\n' "$((SECONDS - STARTED))"
