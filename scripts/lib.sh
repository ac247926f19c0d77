# What the test command and the bench, profile and fault scripts share:
# a free loopback port outside the kernel's ephemeral range, starting a
# tidings server and waiting until it answers, and stopping what a script
# started, by PID, never by name. Sourced, not run.
#
#   . scripts/lib.sh
#   port=$(free_port)
#   serve "$port" TIDINGS_DATA_DIR="$dir"   # $SERVED is its PID
#   ...
#   stop_pid "$SERVED"                     # or stop_started, in a trap

# A free loopback port below the kernel's ephemeral range: a port inside it
# may be held by some client connection's local end (thousands of them after
# a benchmark), and binding a server there fails.
free_port() {
  local port low=32768 high=
  if [ -r /proc/sys/net/ipv4/ip_local_port_range ]; then read -r low high </proc/sys/net/ipv4/ip_local_port_range; fi
  [ "$low" -gt 11000 ] || low=32768
  for _ in $(seq 1 50); do
    port=$((10000 + RANDOM % (low - 10000)))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return 0; fi
  done
  return 1
}

# Waits (10 s) until `url` answers with a success; fails saying which did not.
wait_up() {
  local url=$1
  for _ in $(seq 1 100); do
    curl -sf -o /dev/null "$url" && return 0
    sleep 0.1
  done
  echo "not up within 10 s: $url" >&2
  return 1
}

# Waits (10 s) until something accepts connections on loopback port `port`.
wait_port() {
  local port=$1
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $port within 10 s" >&2
  return 1
}

# Every PID a script started through `started` or `serve`, for `stop_started`.
STARTED=()

# Remembers a PID the script started (`some-server & started $!`).
started() { STARTED+=("$1"); }

# serve PORT [NAME=value ...]: starts `$SERVER_BIN` (else `$BIN`) serving on
# 127.0.0.1:PORT, logging warnings only, with the given environment (which
# may override those two), and waits until its /health answers. Its PID is
# in $SERVED (call it directly, not in `$(...)`, for that).
serve() {
  local port=$1
  shift
  env TIDINGS_LISTEN="127.0.0.1:$port" TIDINGS_LOG=warn "$@" "${SERVER_BIN:-$BIN}" serve >/dev/null 2>&1 &
  SERVED=$!
  started "$SERVED"
  wait_up "http://127.0.0.1:$port/health"
}

# Stops the given PIDs (each one this script started) and waits for them.
stop_pid() {
  local pid kept=() s
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
  for s in "${STARTED[@]}"; do
    for pid in "$@"; do [ "$s" = "$pid" ] && continue 2; done
    kept+=("$s")
  done
  STARTED=("${kept[@]}")
}

# Stops everything this script started and has not stopped yet.
stop_started() {
  if [ "${#STARTED[@]}" -gt 0 ]; then stop_pid "${STARTED[@]}"; fi
}

# CPU ticks (user + system) that process `pid` has used.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Seconds of CPU between two `cpu_ticks` readings, to two decimals.
cpu_seconds() { awk -v t="$(($2 - $1))" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", t/hz}'; }
