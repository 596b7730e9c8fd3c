#!/usr/bin/env bash
# Sourced by .ci/run: installs MariaDB (MySQL's protocol) from Debian's packages if it is missing,
# starts a throwaway server on loopback (its own data dir, port 53306, stopped on exit), creates
# a database and a user without a password (who may make more charlm_* databases: a test needs
# a fresh one), and exports CHARLM_TEST_MYSQL_URL for tests/integration/test_tune.py;
# `charlm_mysql_stop` stops it. Without root, or where it cannot start, it says so and the MySQL
# test is skipped.
charlm_mysql_start() {
  local dir port=53306 sock
  if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
    if [ "$(id -u)" != 0 ]; then
      echo "mysql: not installed and not root: the MySQL test is skipped"; return 0
    fi
    echo "mysql: installing Debian's mariadb-server"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq mariadb-server >/dev/null || { echo "mysql: install failed"; return 0; }
  fi
  dir="$(mktemp -d /tmp/charlm-my.XXXXXX)"
  sock="$dir/mysqld.sock"
  mariadb-install-db --no-defaults --datadir="$dir/data" --user="$(id -un)" \
      --auth-root-authentication-method=socket --skip-test-db >"$dir/install.log" 2>&1 ||
    { echo "mysql: could not make a data dir (see $dir): the MySQL test is skipped"; return 0; }
  /usr/sbin/mariadbd --no-defaults --datadir="$dir/data" --socket="$sock" --port="$port" \
      --bind-address=127.0.0.1 --user="$(id -un)" --pid-file="$dir/mysqld.pid" \
      --skip-name-resolve >"$dir/server.log" 2>&1 &
  CHARLM_MYSQL_DIR="$dir"  # for charlm_mysql_stop, from here on
  for _ in $(seq 60); do
    mariadb-admin --no-defaults --socket="$sock" -u root ping >/dev/null 2>&1 && break
    sleep 0.5
  done
  mariadb --no-defaults --socket="$sock" -u root -e "CREATE DATABASE charlm_test; CREATE USER
      'charlm'@'127.0.0.1'; GRANT ALL ON \`charlm\\_%\`.* TO 'charlm'@'127.0.0.1';" ||
    { echo "mysql: could not start a server (see $dir): the MySQL test is skipped"; return 0; }
  export CHARLM_TEST_MYSQL_URL="mysql+pymysql://charlm@127.0.0.1:$port/charlm_test"
  echo "mysql: running at $CHARLM_TEST_MYSQL_URL"
}
charlm_mysql_stop() {  # never fails: it runs in .ci/run's EXIT trap, under set -e
  [ -n "${CHARLM_MYSQL_DIR:-}" ] || return 0
  kill "$(cat "$CHARLM_MYSQL_DIR/mysqld.pid" 2>/dev/null)" 2>/dev/null || true
  sleep 1
  rm -rf "$CHARLM_MYSQL_DIR" || true
}
charlm_mysql_start
