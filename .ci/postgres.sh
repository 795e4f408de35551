#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the service tests and print its URL on stdout.
# Installs Debian's postgresql package when it is missing (CI runs as root on a clean machine).
#   usage: eval "$(bash .ci/postgres.sh)"   # exports OPENRFT_TEST_POSTGRES_URL
set -euo pipefail
PGPORT="${PGPORT:-55432}"
PGROOT="${PGROOT:-/tmp/openrft-pg-$PGPORT}"

bindir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
if [ -z "$(bindir)" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
fi
BIN="$(bindir)"
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
if ! as_pg "$BIN/pg_ctl" -D "$PGROOT/data" status >/dev/null 2>&1; then
  rm -rf "$PGROOT"
  mkdir -p "$PGROOT"
  [ "$(id -u)" = 0 ] && chown postgres "$PGROOT"
  as_pg "$BIN/initdb" -D "$PGROOT/data" -U postgres --auth=trust -E UTF8 >/dev/null
  as_pg "$BIN/pg_ctl" -D "$PGROOT/data" -l "$PGROOT/log" -w \
    -o "-p $PGPORT -k $PGROOT -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" start >&2
fi
as_pg "$BIN/psql" -h 127.0.0.1 -p "$PGPORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='openrft_test'" \
  | grep -q 1 || as_pg "$BIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U postgres openrft_test
echo "export OPENRFT_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$PGPORT/openrft_test"
