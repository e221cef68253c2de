# scripts/lib.sh: helpers shared by scripts/demo and scripts/bench (sourced, not run).
# Everything a script starts is recorded and stopped on exit, whatever happens.

KVGATE_PIDS=()
KVGATE_TMP=$(mktemp -d /tmp/kvgate.XXXXXX)
cleanup() {
  for pid in "${KVGATE_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${KVGATE_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$KVGATE_TMP"
}
trap cleanup EXIT INT TERM

# A TCP port on 127.0.0.1 that is free now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start NAME LOGFILE CMD...: runs CMD in the background, remembering its pid.
start() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  KVGATE_PIDS+=($!)
}

# wait_http URL [SECONDS]: waits until URL answers 200.
wait_http() {
  local url=$1 limit=${2:-20}
  for _ in $(seq 1 $((limit * 20))); do
    curl -fs -o /dev/null "$url" && return 0
    sleep 0.05
  done
  echo "timed out waiting for $url" >&2
  return 1
}
