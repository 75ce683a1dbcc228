# Supervision of the local stack's long-running processes; sourced by tools/local-stack.sh.
#
#   supervise NAME LOG PIDFILE COMMAND...
#     Runs COMMAND (its output appended to LOG) under a supervisor in the background and sets
#     SUPERVISOR_PID to the supervisor's pid. PIDFILE always holds the pid of the running COMMAND.
#   run_supervised NAME LOG PIDFILE COMMAND...
#     The same supervisor in the current shell: returns once it was stopped.
#
# When COMMAND exits, for whatever reason, the supervisor writes one line (to its standard error
# and to LOG) naming it, its pid, how it ended (exit status or signal), how long it ran and the
# delay, waits that long and starts it again. The delay starts at KRANE_UP_BACKOFF_MS (1000),
# doubles with every restart up to KRANE_UP_BACKOFF_MAX_MS (30000), and is back at the start
# once COMMAND stayed up KRANE_UP_STABLE_S seconds (60): a process that keeps crashing is not
# restarted in a tight loop, and one that crashes once a day is back within a second.
#
# SIGTERM stops the supervisor: COMMAND gets SIGTERM, then SIGKILL when it is still there after
# KRANE_UP_STOP_GRACE_S seconds (10); the supervisor removes PIDFILE and exits 0 once COMMAND is
# gone. A supervisor waiting out a delay exits at once.

# "exited with status 1", "was killed by SIGKILL".
_supervise_describe_exit() {
  local status="$1"
  if ((status > 128)) && kill -l "$((status - 128))" >/dev/null 2>&1; then
    printf 'was killed by SIG%s' "$(kill -l "$((status - 128))")"
  else
    printf 'exited with status %d' "$status"
  fi
}

# Milliseconds as seconds: "1", "0.25" (for people and for sleep).
_supervise_seconds() {
  local ms="$1"
  if ((ms % 1000 == 0)); then
    printf '%d' "$((ms / 1000))"
  else
    printf '%d.%03d' "$((ms / 1000))" "$((ms % 1000))" | sed -e 's/0*$//'
  fi
}

run_supervised() {
  local name="$1" log="$2" pidfile="$3"
  shift 3
  local min_ms="${KRANE_UP_BACKOFF_MS:-1000}" max_ms="${KRANE_UP_BACKOFF_MAX_MS:-30000}"
  local stable_s="${KRANE_UP_STABLE_S:-60}" grace_s="${KRANE_UP_STOP_GRACE_S:-10}"
  local delay_ms="$min_ms" child="" last="" stopping=0 status=0 started=0 ran=0 restarts=0
  local sleeper="" line i
  set +e
  # A signal ends `wait` early; the loop below then sees `stopping`. The trap also ends the
  # delay's sleep, in case the signal came just before `wait`.
  trap 'stopping=1
        if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi
        if [ -n "$sleeper" ]; then kill "$sleeper" 2>/dev/null; fi' TERM INT
  while ((!stopping)); do
    "$@" >>"$log" 2>&1 &
    child=$!
    printf '%s\n' "$child" >"$pidfile"
    if ((stopping)); then kill -TERM "$child" 2>/dev/null; break; fi  # a signal before `child=`
    if ((restarts > 0)); then
      printf 'up: %s restarted (pid %d, restart %d)\n' "$name" "$child" "$restarts" >&2
    fi
    started=$SECONDS
    wait "$child" 2>/dev/null  # (bash would print "Killed" for a child ended by a signal)
    status=$?
    ((!stopping)) || break
    last="$child"
    child=""
    ran=$((SECONDS - started))
    if ((ran >= stable_s)); then delay_ms="$min_ms"; fi
    restarts=$((restarts + 1))
    line="$name (pid $last) $(_supervise_describe_exit "$status") after ${ran}s; restarting in $(_supervise_seconds "$delay_ms")s"
    printf 'up: %s\n' "$line" >&2
    printf '%s up: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%S)" "$line" >>"$log"
    sleep "$(_supervise_seconds "$delay_ms")" &
    sleeper=$!
    ((stopping)) || wait "$sleeper"
    kill "$sleeper" 2>/dev/null
    wait "$sleeper" 2>/dev/null
    sleeper=""
    ((!stopping)) || break
    delay_ms=$((delay_ms * 2 > max_ms ? max_ms : delay_ms * 2))
  done
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null
    for ((i = 0; i < grace_s * 10; i++)); do
      kill -0 "$child" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$child" 2>/dev/null; then
      printf 'up: %s (pid %d) did not stop within %ds; killing it\n' "$name" "$child" "$grace_s" >&2
      kill -KILL "$child" 2>/dev/null
    fi
    wait "$child" 2>/dev/null
  fi
  rm -f "$pidfile"
  trap - TERM INT
  return 0
}

supervise() {
  run_supervised "$@" &
  SUPERVISOR_PID=$!
}
