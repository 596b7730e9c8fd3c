#!/usr/bin/env bash
# Sourced by .ci/run: installs PostgreSQL from Debian's packages if it is missing, starts a
# throwaway server on loopback (its own data dir, port 55432, trust auth, stopped on exit) and
# exports CHARLM_TEST_POSTGRES_URL for tests/integration/test_tune.py; `charlm_pg_stop` stops it.
# Without root, or where it cannot start, it says so and the PostgreSQL test is skipped.
charlm_pg_start() {
  local bin dir port=55432
  if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      echo "postgres: not installed and not root: the PostgreSQL test is skipped"; return 0
    fi
    echo "postgres: installing Debian's postgresql"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq postgresql >/dev/null || { echo "postgres: install failed"; return 0; }
  fi
  bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
  dir="$(mktemp -d /tmp/charlm-pg.XXXXXX)"
  if [ "$(id -u)" = 0 ]; then
    chown postgres "$dir"
    run_pg() { su postgres -s /bin/bash -c "$*"; }
  else
    run_pg() { bash -c "$*"; }
  fi
  run_pg "$bin/initdb -D $dir/data -A trust -U postgres" >"$dir/initdb.log" 2>&1 &&
    run_pg "$bin/pg_ctl -D $dir/data -l $dir/server.log -w -o \"-c listen_addresses=127.0.0.1 -p $port -k $dir\" start" >/dev/null &&
    "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres charlm_test ||
    { echo "postgres: could not start a server (see $dir): the PostgreSQL test is skipped"; return 0; }
  export CHARLM_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/charlm_test"
  CHARLM_PG_STOP="run_pg '$bin/pg_ctl -D $dir/data -m fast stop' >/dev/null 2>&1 || true; rm -rf '$dir' || true"
  echo "postgres: running at $CHARLM_TEST_POSTGRES_URL"
}
charlm_pg_stop() { eval "${CHARLM_PG_STOP:-}"; }  # never fails: it runs in .ci/run's EXIT trap
charlm_pg_start
