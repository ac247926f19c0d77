# Sourced by scripts/test and scripts/bench: starts a throwaway PostgreSQL
# cluster in a temporary directory on a free loopback port and stops it when
# the calling script exits. Installs Debian's `postgresql` package when the
# server binaries are missing and this runs as root.
# Usage: start_pg [extra postgres -c options...]; then $PG_URL, $PG_CTL.

find_pg_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; return 0; fi
  return 1
}

PGBIN=$(find_pg_bin || true)
if [ -z "$PGBIN" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "scripts/test: installing PostgreSQL (Debian package postgresql)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    PGBIN=$(find_pg_bin)
  else
    echo "scripts/test: PostgreSQL server binaries are missing; install the 'postgresql' package (or run as root)" >&2
    exit 1
  fi
fi

TMP=$(mktemp -d /tmp/tidings-test.XXXXXX)
RUNAS=()
if [ "$(id -u)" = 0 ]; then
  # initdb refuses to run as root: the cluster belongs to a system user.
  id tidings-test >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin tidings-test
  chown tidings-test "$TMP"
  RUNAS=(runuser -u tidings-test --)
fi

free_port() {
  local port
  for _ in $(seq 1 50); do
    port=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return 0; fi
  done
  return 1
}
PORT=$(free_port)

cleanup() {
  "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$TMP/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT

start_pg() {
  local opts="-p $PORT -k $TMP -c listen_addresses=127.0.0.1 -c max_connections=400"
  local o
  for o in "$@"; do opts="$opts -c $o"; done
  "${RUNAS[@]}" "$PGBIN/initdb" -D "$TMP/data" -U postgres --auth=trust -E UTF8 >/dev/null
  "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$TMP/data" -l "$TMP/postgres.log" -w -o "$opts" start >/dev/null
  PG_URL="postgres://postgres@127.0.0.1:$PORT/postgres"
  PG_CTL="${RUNAS[*]} $PGBIN/pg_ctl -D $TMP/data -l $TMP/postgres.log"
}

