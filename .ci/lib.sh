# Shared setup for .ci/demo, .ci/test and .ci/run: installs whatever is missing.
# Source it; it defines functions and cds to the repository root.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '\033[1m==> [%s] %s\033[0m\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  log "apt-get install $*"
  if [ -z "${_APT_UPDATED:-}" ]; then as_root apt-get update -qq; _APT_UPDATED=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The MySQL client headers that mysqlclient compiles against.
ensure_build_deps() {
  if ! pkg-config --exists mysqlclient 2>/dev/null && ! pkg-config --exists libmariadb 2>/dev/null \
     && ! pkg-config --exists mariadb 2>/dev/null; then
    apt_install libmariadb-dev pkg-config gcc
  fi
}

pick_python() {
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 \
       && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return
    fi
  done
  apt_install python3 python3-venv python3-dev
  echo python3
}

# ensure_venv DIR PYTHON [extra pip args...]: a virtualenv with requirements.txt installed
# (pass `-r requirements-dev.txt` for the build, lint and type-check tools).
ensure_venv() {
  local dir="$1" python="$2"; shift 2
  local stamp="$dir/.requirements.sha"
  local want; want="$({ cat requirements.txt requirements-dev.txt; printf '%s\n' "$@"; } | sha256sum | cut -d' ' -f1)"
  if [ ! -x "$dir/bin/python" ]; then
    log "creating virtualenv $dir ($("$python" --version))"
    "$python" -m venv "$dir"
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    ensure_build_deps
    log "installing requirements into $dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    "$dir/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt "$@"
    echo "$want" > "$stamp"
  fi
}

# The repository's virtualenv: requirements.txt plus the dev tools of requirements-dev.txt
# (build, ruff, mypy). Every script uses this one, so its stamp does not flip between them.
ensure_repo_venv() { ensure_venv .venv "$(pick_python)" -r requirements-dev.txt; }

# find_python X.Y: print a runnable interpreter of exactly that version, or nothing. pyenv
# installs shims for versions that are not selected, so each candidate is run to be sure.
find_python() {
  local want="$1" py
  for py in "python$want" /root/.pyenv/versions/"$want".*/bin/python3 "$HOME"/.pyenv/versions/"$want".*/bin/python3; do
    if "$py" -c "import sys; sys.exit('%d.%d' % sys.version_info[:2] != '$want')" >/dev/null 2>&1; then
      "$py" -c 'import sys; print(sys.executable)'
      return
    fi
  done
}

# Can the test user log in? (mysqladmin ping succeeds even when access is denied.)
mariadb_ping() { mysql --protocol=tcp -h127.0.0.1 -P3306 -usqlqueue -psqlqueue -e 'SELECT 1' >/dev/null 2>&1; }
# Is a server up at all, on TCP or on the socket?
mariadb_alive() {
  mysqladmin --protocol=tcp -h127.0.0.1 -P3306 -uroot ping >/dev/null 2>&1 || mysqladmin -uroot ping >/dev/null 2>&1
}

# Admin access: root over TCP (passwordless, as on the dev machines) or over the socket.
mariadb_admin() {
  if mysql --protocol=tcp -h127.0.0.1 -uroot -e 'SELECT 1' >/dev/null 2>&1; then
    mysql --protocol=tcp -h127.0.0.1 -uroot "$@"
  else
    as_root mysql -uroot "$@"
  fi
}

# A running MariaDB on 127.0.0.1:3306 with a 'sqlqueue' user: install, start, create.
ensure_mariadb() {
  if mariadb_ping; then return; fi
  if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
    apt_install mariadb-server mariadb-client
  fi
  if ! mariadb_alive; then
    log "starting MariaDB"
    as_root mkdir -p /run/mysqld /var/log/mysql
    as_root chown mysql:mysql /run/mysqld /var/log/mysql 2>/dev/null || true
    if [ ! -d /var/lib/mysql/mysql ]; then
      as_root mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    for _ in $(seq 1 60); do mariadb_alive && break; sleep 1; done
  fi
  log "creating MariaDB user sqlqueue"
  mariadb_admin -e "
    CREATE USER IF NOT EXISTS 'sqlqueue'@'127.0.0.1' IDENTIFIED BY 'sqlqueue';
    CREATE USER IF NOT EXISTS 'sqlqueue'@'localhost' IDENTIFIED BY 'sqlqueue';
    GRANT ALL PRIVILEGES ON *.* TO 'sqlqueue'@'127.0.0.1';
    GRANT ALL PRIVILEGES ON *.* TO 'sqlqueue'@'localhost';
    CREATE DATABASE IF NOT EXISTS sqlqueue CHARACTER SET utf8mb4;"
  mariadb_ping || { log "MariaDB is not reachable on 127.0.0.1:3306"; exit 1; }
}

# The databases CI uses; set MYSQL_URL/POSTGRES_URL to run beside others on a shared server.
MYSQL_URL="${MYSQL_URL:-mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue}"
POSTGRES_URL="${POSTGRES_URL:-postgres://sqlqueue:sqlqueue@127.0.0.1:5432/sqlqueue}"

postgres_ping() { PGPASSWORD=sqlqueue psql -h 127.0.0.1 -U sqlqueue -d postgres -tAc 'SELECT 1' >/dev/null 2>&1; }

# A running PostgreSQL on 127.0.0.1:5432 with a 'sqlqueue' superuser (tests create databases).
ensure_postgres() {
  if postgres_ping; then return; fi
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    apt_install postgresql postgresql-client
  fi
  if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
    log "starting PostgreSQL"
    local version; version="$(ls /etc/postgresql | sort -V | tail -n1)"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start
    for _ in $(seq 1 60); do pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 && break; sleep 1; done
  fi
  log "creating PostgreSQL role sqlqueue"
  as_root runuser -u postgres -- psql -v ON_ERROR_STOP=1 -qc "DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sqlqueue') THEN CREATE ROLE sqlqueue LOGIN SUPERUSER PASSWORD 'sqlqueue'; END IF; END\$\$"
  postgres_ping || { log "PostgreSQL is not reachable on 127.0.0.1:5432 as sqlqueue"; exit 1; }
}

# Debian's chromium for the console's browser tests (Playwright's own download does not work here).
ensure_chromium() {
  if [ ! -x /usr/bin/chromium ]; then apt_install chromium fonts-dejavu-core; fi
}

# Debian's prometheus server for tests/metrics/test_prometheus.py (which starts its own on a free
# port). Without systemd apt starts no service; where one was started, stop it: the tests need none.
# SQLQUEUE_CI_PROMETHEUS=1 makes that test fail instead of skipping when the binary is missing.
ensure_prometheus() {
  if [ ! -x /usr/bin/prometheus ]; then
    apt_install prometheus
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
      as_root systemctl stop prometheus || true
    elif [ -x /etc/init.d/prometheus ]; then
      as_root /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    fi
  fi
  export SQLQUEUE_CI_PROMETHEUS=1
}

# The spark extra in a venv: Java 17, the MariaDB JDBC driver, and pyspark from a wheel built
# once and cached in $SPARK_WHEELS (pyspark 4.x is a large source package: ~1.5 min to build).
SPARK_WHEELS="${SQLQUEUE_WHEEL_CACHE:-$HOME/.cache/sqlqueue-wheels}"
PYSPARK_VERSION="4.3.0"
ensure_spark() {
  local venv="$1"
  if ! java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])'; then
    apt_install openjdk-17-jre-headless
  fi
  if [ ! -e /usr/share/java/mariadb-java-client.jar ]; then
    apt_install libmariadb-java
  fi
  if ! "$venv/bin/python" -c 'import pyspark, pyarrow, matplotlib' >/dev/null 2>&1; then
    mkdir -p "$SPARK_WHEELS"
    if ! ls "$SPARK_WHEELS"/pyspark-"$PYSPARK_VERSION"-*.whl >/dev/null 2>&1; then
      log "building the pyspark $PYSPARK_VERSION wheel (once; cached in $SPARK_WHEELS)"
      "$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps "pyspark==$PYSPARK_VERSION" -w "$SPARK_WHEELS"
    fi
    log "installing the spark extra into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --find-links "$SPARK_WHEELS" \
      "pyspark==$PYSPARK_VERSION" "pyarrow>=15" "matplotlib>=3.8"
  fi
}

# The Spark tests (tests/spark: real SparkSession, a standalone cluster) in $1, on MariaDB and
# on PostgreSQL. The standalone-cluster test runs on MariaDB only: it tests Spark's deployment
# (a master and two workers, ~40 s to start), not the database.
run_spark_tests() {
  local venv="$1"
  ensure_spark "$venv"
  log "tests/spark on MariaDB"
  DATABASE_URL="$MYSQL_URL" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/spark
  ensure_postgres
  log "tests/spark on PostgreSQL (without the standalone cluster)"
  DATABASE_URL="$POSTGRES_URL" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/spark \
    --deselect tests/spark/test_cluster.py::test_backfill_runs_on_a_standalone_cluster
}

# build_dist OUTDIR [ARGS...]: `python -m build ARGS` from a copy of the tracked files, so that
# what ships is what a clean clone holds: hatchling builds nothing into the source tree, but
# it would pack an untracked file (not in .gitignore) lying in the checkout.
build_dist() {
  local out="$1"; shift
  local src
  src="$(mktemp -d "${TMPDIR:-/tmp}/sqlqueue-src.XXXXXX")"
  git ls-files -z | xargs -0 cp --parents -t "$src"
  if ! (cd "$src" && "$ROOT/.venv/bin/python" -m build "$@" --outdir "$out" .); then
    rm -rf "$src"
    return 1
  fi
  rm -rf "$src"
}
