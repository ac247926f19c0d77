# Sourced by scripts/test and scripts/bench: starts a throwaway PostgreSQL
# cluster in a temporary directory on a free loopback port and stops it when
# the calling script exits. Installs Debian's `postgresql` package when the
# server binaries are missing and this runs as root.
# Usage: start_pg [extra postgres settings...]; then $PG_URL and $PG_CTL (a
# pg_ctl command line for that cluster: "$PG_CTL stop", "$PG_CTL start").
# start_pg_named NAME [settings...] starts one more cluster and sets
# PG_URL_<NAME> and PG_CTL_<NAME>.
# start_standby NAME PORT starts a hot standby of the cluster on PORT
# (pg_basebackup -R: streaming replication) and sets PG_URL_<NAME> and
# PG_CTL_<NAME>.

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
    # The package's own cluster is never started: only throwaway clusters run.
    # shellcheck source=scripts/apt.sh
    . "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
    apt_install postgresql
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

# free_port and the rest of what the scripts share.
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PORT=$(free_port)

cleanup() {
  local d
  for d in "$TMP"/*/; do
    [ -f "$d/PG_VERSION" ] && "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT

# start_on DIR PORT: starts the cluster in DIR on PORT; if it cannot start
# (the port was taken meanwhile, say), tries again on other ports. Sets
# CLUSTER_PORT to the port it listens on.
start_on() {
  local dir=$1 port=$2 attempt
  for attempt in 1 2 3; do
    echo "port = $port" >>"$dir/postgresql.conf"   # the last setting wins
    if "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$dir" -l "$dir.log" -w start >/dev/null; then
      CLUSTER_PORT=$port
      return 0
    fi
    echo "scripts: PostgreSQL in $dir did not start on port $port (attempt $attempt); its log:" >&2
    tail -n 20 "$dir.log" >&2
    port=$(free_port)
  done
  exit 1
}

# pg_cluster DIR PORT [settings...]: initdb with every setting written into
# postgresql.conf (so a plain "pg_ctl start" restarts it the same way), then
# start it (start_on).
pg_cluster() {
  local dir=$1 port=$2 o
  shift 2
  "${RUNAS[@]}" "$PGBIN/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >/dev/null
  {
    echo "listen_addresses = '127.0.0.1'"
    echo "unix_socket_directories = '$TMP'"
    echo "max_connections = 400"
    for o in "$@"; do echo "$o"; done
  } >>"$dir/postgresql.conf"
  start_on "$dir" "$port"
}

start_pg() {
  pg_cluster "$TMP/data" "$PORT" "$@"
  PORT=$CLUSTER_PORT
  PG_URL="postgres://postgres@127.0.0.1:$PORT/postgres"
  PG_CTL="${RUNAS[*]} $PGBIN/pg_ctl -D $TMP/data -l $TMP/data.log -w"
}

start_pg_named() {
  local name=$1 port
  shift
  port=$(free_port)
  pg_cluster "$TMP/$name" "$port" "$@"
  port=$CLUSTER_PORT
  printf -v "PG_URL_$name" '%s' "postgres://postgres@127.0.0.1:$port/postgres"
  printf -v "PG_CTL_$name" '%s' "${RUNAS[*]} $PGBIN/pg_ctl -D $TMP/$name -l $TMP/$name.log -w"
}

start_standby() {
  local name=$1 primary=$2 dir=$TMP/$1
  "${RUNAS[@]}" "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$primary" -U postgres -D "$dir" -R -X stream >/dev/null
  start_on "$dir" "$(free_port)"
  printf -v "PG_URL_$name" '%s' "postgres://postgres@127.0.0.1:$CLUSTER_PORT/postgres"
  printf -v "PG_CTL_$name" '%s' "${RUNAS[*]} $PGBIN/pg_ctl -D $dir -l $dir.log -w"
}
