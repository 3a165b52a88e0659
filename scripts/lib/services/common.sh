# shellcheck shell=bash
# The helpers every service uses: logging, ports and pid files, answering, packages.
# Sourced by scripts/services, whose globals (ports, users, STATE_DIR) and helpers
# (scripts/lib/services/common.sh) it uses; not run on its own.

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

# Print the last lines of a log file to stderr (used on failures).
show_log() {
    local file=$1
    if [[ -s $file ]]; then
        printf '%s: ---- last lines of %s ----\n' "$PROG" "$file" >&2
        tail -n 30 "$file" >&2 || true
        printf '%s: ---- end of %s ----\n' "$PROG" "$file" >&2
    else
        printf '%s: (log file %s is empty or missing)\n' "$PROG" "$file" >&2
    fi
}

# die, showing the tail of a log file first.
die_log() {
    local file=$1
    shift
    show_log "$file"
    die "$@"
}

usage() {
    cat >&2 <<'EOF'
usage: scripts/services up|down|status|env|crash|failover [redis] [zookeeper] [mysql] [postgres]
                                          [redis-cluster] [zk-ensemble] [redis-sentinel]
                                          [etcd] [etcd-cluster] [tools]
       scripts/services compose-check

  up      start (or reuse) the services; prints export lines on stdout
  down    stop the services this script started (never touches others)
  status  one line per service: up/down, reused or started by us
  env     print the export lines (for eval)
  crash   SIGKILL a server this script started, start it again and wait until it
          answers (one of mysql, postgres, redis, zookeeper, zk-ensemble, redis-cluster,
          etcd, etcd-cluster; zk-ensemble and etcd-cluster: the leader, then all three
          healthy with a leader; redis-cluster: the master of slot 0, no failover, then
          cluster_state:ok on every node; each wait is bounded by DLOCK_SERVICES_TIMEOUT;
          the services' Redis keeps nothing on disk unless DLOCK_REDIS_AOF=yes, so a
          crash loses its keys)
  failover  redis-sentinel only: SENTINEL FAILOVER, then wait until the Sentinels agree
          on the new master and it has its replica online
  compose-check  start the redis service of compose/docker-compose.yml alone on a spare
          port (project dlock-compose-check), PING it, take it down; skipped (exit 0)
          without docker compose or a Docker daemon

Ports can be overridden with DLOCK_REDIS_PORT, DLOCK_ZK_PORT, DLOCK_MYSQL_PORT,
DLOCK_POSTGRES_PORT and DLOCK_REDIS_CLUSTER_PORT (base of 3 consecutive ports, default 7000); the state
directory with DLOCK_SERVICES_DIR.  With no names, all but zk-ensemble are
selected; zk-ensemble (3 ZooKeeper servers on DLOCK_ZK_ENSEMBLE_PORT, default
2281, and the next two ports) and redis-sentinel (a master on
DLOCK_REDIS_SENTINEL_DATA_PORT, default 6390, its replica on the next port, and
three Sentinels from DLOCK_REDIS_SENTINEL_PORT, default 26390), etcd (one
member on DLOCK_ETCD_PORT, default 2379), etcd-cluster (3 members from
DLOCK_ETCD_CLUSTER_PORT, default 2479) and tools (installs protoc, openssl, jq and
libfaketime) only run
when named.
EOF
    exit 2
}

validate_port() {
    local name=$1 value=$2
    if [[ ! $value =~ ^[0-9]+$ ]] || ((value < 1 || value > 65535)); then
        die "$name must be a TCP port number, got '$value'"
    fi
}

# Instance name: the plain service name on the default port, otherwise suffixed
# with the port, so that e.g. a private Redis on 6390 never shares a pid file
# with one on 6379.
instance_name() {
    local svc=$1 port default
    case $svc in
        redis) port=$REDIS_PORT default=$DEFAULT_REDIS_PORT ;;
        zookeeper) port=$ZK_PORT default=$DEFAULT_ZK_PORT ;;
        mysql) port=$MYSQL_PORT default=$DEFAULT_MYSQL_PORT ;;
        postgres) port=$POSTGRES_PORT default=$DEFAULT_POSTGRES_PORT ;;
    esac
    local base=$svc
    [[ $svc == zookeeper ]] && base=zk
    if [[ $port == "$default" ]]; then
        printf '%s' "$base"
    else
        printf '%s-%s' "$base" "$port"
    fi
}

service_port() {
    case $1 in
        redis) printf '%s' "$REDIS_PORT" ;;
        zookeeper) printf '%s' "$ZK_PORT" ;;
        mysql) printf '%s' "$MYSQL_PORT" ;;
        postgres) printf '%s' "$POSTGRES_PORT" ;;
        redis-cluster) printf '%s-%s' "$REDIS_CLUSTER_PORT" "$((REDIS_CLUSTER_PORT + 2))" ;;
        zk-ensemble) printf '%s-%s' "$ZK_ENSEMBLE_PORT" "$((ZK_ENSEMBLE_PORT + 2))" ;;
        redis-sentinel) printf '%s-%s' "$REDIS_SENTINEL_PORT" "$((REDIS_SENTINEL_PORT + 2))" ;;
        etcd) printf '%s' "$ETCD_PORT" ;;
        etcd-cluster) printf '%s-%s' "$ETCD_CLUSTER_PORT" "$((ETCD_CLUSTER_PORT + 2))" ;;
    esac
}

env_line() {
    case $1 in
        redis) printf 'export DLOCK_REDIS_URL=redis://%s:%s\n' "$HOST" "$REDIS_PORT" ;;
        zookeeper) printf 'export DLOCK_ZK_URL=zk://%s:%s\n' "$HOST" "$ZK_PORT" ;;
        mysql)
            printf 'export DLOCK_MYSQL_URL=mysql://%s:%s@%s:%s/%s\n' \
                "$MYSQL_USER" "$MYSQL_PASSWORD" "$HOST" "$MYSQL_PORT" "$MYSQL_DB"
            printf 'export DLOCK_MYSQL_TIMED_URL=mysql://%s:%s@%s:%s/%s\n' \
                "$MYSQL_TIMED_USER" "$MYSQL_PASSWORD" "$HOST" "$MYSQL_PORT" "$MYSQL_DB"
            ;;
        postgres)
            printf 'export DLOCK_POSTGRES_URL=postgres://%s:%s@%s:%s/%s\n' \
                "$PG_USER" "$PG_PASSWORD" "$HOST" "$POSTGRES_PORT" "$PG_DB"
            ;;
        redis-cluster)
            printf 'export DLOCK_REDIS_CLUSTER_URL=redis://%s:%s/?cluster=true\n' "$HOST" "$REDIS_CLUSTER_PORT"
            ;;
        zk-ensemble)
            printf 'export DLOCK_ZK_ENSEMBLE_URL=zk://%s:%s,%s:%s,%s:%s\n' \
                "$HOST" "$ZK_ENSEMBLE_PORT" "$HOST" "$((ZK_ENSEMBLE_PORT + 1))" \
                "$HOST" "$((ZK_ENSEMBLE_PORT + 2))"
            ;;
        redis-sentinel)
            printf 'export DLOCK_REDIS_SENTINEL_URL=redis+sentinel://%s:%s,%s:%s,%s:%s/%s\n' \
                "$HOST" "$REDIS_SENTINEL_PORT" "$HOST" "$((REDIS_SENTINEL_PORT + 1))" \
                "$HOST" "$((REDIS_SENTINEL_PORT + 2))" "$SENTINEL_MASTER"
            ;;
        etcd) printf 'export DLOCK_ETCD_URL=etcd://%s:%s\n' "$HOST" "$ETCD_PORT" ;;
        etcd-cluster)
            printf 'export DLOCK_ETCD_CLUSTER_URL=etcd://%s:%s,%s:%s,%s:%s\n' \
                "$HOST" "$ETCD_CLUSTER_PORT" "$HOST" "$((ETCD_CLUSTER_PORT + 1))" \
                "$HOST" "$((ETCD_CLUSTER_PORT + 2))"
            ;;
    esac
}

ensure_state_dir() {
    mkdir -p "$STATE_DIR"
    STATE_DIR=$(cd "$STATE_DIR" && pwd -P)
}

# Is $pid a live (non-zombie) process whose command line contains $pattern?
pid_matches() {
    local pid=$1 pattern=$2 cmd state
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    if [[ -r /proc/$pid/stat ]]; then
        state=$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
        [[ $state == Z || $state == X ]] && return 1
        cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    else
        cmd=$(ps -p "$pid" -o args= 2>/dev/null) || return 1
    fi
    [[ $cmd == *"$pattern"* ]]
}

# Wait until process $1, just started in the background, has become its command (its command
# line holds $2), or has exited; at most 10 s. Between the fork and the exec it is still this
# shell, and a check in that window (slow on a loaded machine) would take a starting server
# for one that exited and remove its pid file.
wait_for_exec() {
    local pid=$1 pattern=$2 until=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && ! pid_matches "$pid" "$pattern" && ((SECONDS < until)); do
        sleep 0.1
    done
}

# Print the pid recorded in $pidfile if it is one of ours and still running;
# remove stale pid files.  Returns non-zero when there is no such process.
our_pid() {
    local pidfile=$1 pattern=$2 pid
    [[ -f $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile" 2>/dev/null || true)
    if [[ -n $pid ]] && pid_matches "$pid" "$pattern"; then
        printf '%s' "$pid"
        return 0
    fi
    rm -f "$pidfile"
    return 1
}

# The helpers below run small `bash -c` programs under `timeout`; their
# arguments arrive as $0, $1, ... inside the single-quoted program text.

# Does anything accept TCP connections on 127.0.0.1:$1?
# shellcheck disable=SC2016
tcp_open() {
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$HOST" "$1" 2>/dev/null
}

# Send $2 to 127.0.0.1:$1 and print whatever comes back within a few seconds
# (only the first line when $3 is "line").
# shellcheck disable=SC2016
tcp_talk() {
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
        printf "%b" "$2" >&3
        if [[ $3 == line ]]; then IFS= read -r line <&3 || true; printf "%s" "$line"
        else cat <&3; fi' "$HOST" "$1" "$2" "${3:-all}" 2>/dev/null || true
}

# 0: a usable Redis answers; 1: nothing usable answers.
redis_answers() {
    local reply
    reply=$(tcp_talk "$1" 'PING\r\n' line)
    [[ $reply == +PONG* ]]
}

# 0: ZooKeeper answers four-letter words (srvr, falling back to ruok).
zk_answers() {
    local reply
    reply=$(tcp_talk "$1" 'srvr')
    [[ $reply == *"Zookeeper version"* ]] && return 0
    if [[ $reply == *"not in the whitelist"* ]]; then
        reply=$(tcp_talk "$1" 'ruok')
        [[ $reply == imok* ]] && return 0
        # A ZooKeeper with all four-letter words disabled: it still answered.
        return 0
    fi
    return 1
}

# Warns when the ZooKeeper on port $1 ticks slower than the 1 s this script configures: a
# server expires a session on the first tick after its timeout, so the torture's 2 s sessions
# would end up to a whole tick late (a server this script started before it ticked every 1 s
# keeps its old configuration until it is restarted: `down zookeeper`, then `up`).
zk_check_tick() {
    local tick
    tick=$(tcp_talk "$1" 'conf' | sed -n 's/^tickTime=\([0-9]*\).*/\1/p')
    if [[ -n $tick && $tick -gt 1000 ]]; then
        warn "zookeeper: the server on $HOST:$1 ticks every $tick ms (scripts/services uses 1000): sessions expire up to a tick late"
    fi
}

mysql_admin_bin() {
    local b
    for b in mariadb-admin mysqladmin; do
        if command -v "$b" >/dev/null 2>&1; then
            printf '%s' "$b"
            return 0
        fi
    done
    return 1
}

mysql_client_bin() {
    local b
    for b in mariadb mysql; do
        if command -v "$b" >/dev/null 2>&1; then
            printf '%s' "$b"
            return 0
        fi
    done
    return 1
}

# Find an executable in PATH or in the usual sbin directories.
find_bin() {
    local name dir
    for name in "$@"; do
        if command -v "$name" >/dev/null 2>&1; then
            command -v "$name"
            return 0
        fi
        for dir in /usr/sbin /usr/local/sbin /sbin /usr/libexec; do
            if [[ -x $dir/$name ]]; then
                printf '%s/%s' "$dir" "$name"
                return 0
            fi
        done
    done
    return 1
}

# 0: a MySQL/MariaDB server answers on the port.  Reads the server greeting
# (protocol version 10, or an error packet 0xff, e.g. "too many connections")
# without logging in, so no "access denied" noise ends up in the server's log
# and no client tools are needed.
mysql_answers() {
    local bytes
    # shellcheck disable=SC2016 # $0/$1 are expanded by the inner bash
    bytes=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1; head -c 5 <&3 | od -An -tx1' \
        "$HOST" "$1" 2>/dev/null || true)
    bytes=${bytes//[[:space:]]/}
    [[ ${#bytes} -eq 10 && (${bytes: -2} == 0a || ${bytes: -2} == ff) ]]
}

service_answers() {
    case $1 in
        redis) redis_answers "$REDIS_PORT" ;;
        zookeeper) zk_answers "$ZK_PORT" ;;
        mysql) mysql_answers "$MYSQL_PORT" ;;
        postgres) postgres_answers "$POSTGRES_PORT" ;;
        redis-cluster) cluster_answers ;;
    esac
}

# Pattern used to recognise our own server process in /proc/<pid>/cmdline.
service_pattern() {
    local name
    name=$(instance_name "$1")
    case $1 in
        redis) printf 'redis-server' ;;
        zookeeper) printf '%s/%s/zoo.cfg' "$STATE_DIR" "$name" ;;
        mysql) printf -- '--datadir=%s/%s/data' "$STATE_DIR" "$name" ;;
        postgres) printf -- '-D %s/%s/data' "$STATE_DIR" "$name" ;;
    esac
}

service_pidfile() {
    printf '%s/%s.pid' "$STATE_DIR" "$(instance_name "$1")"
}

service_logfile() {
    printf '%s/%s.log' "$STATE_DIR" "$(instance_name "$1")"
}

# Poll until the service answers; fail early if our process died.
wait_until_answers() {
    local svc=$1 pidfile=$2 logfile=$3 pattern deadline
    pattern=$(service_pattern "$svc")
    deadline=$((SECONDS + TIMEOUT))
    while ((SECONDS < deadline)); do
        if service_answers "$svc"; then
            return 0
        fi
        # The pid file may appear a little after start-up (daemonizing servers).
        if [[ -f $pidfile ]] && ! our_pid "$pidfile" "$pattern" >/dev/null; then
            die_log "$logfile" "$svc server exited during start-up (port $(service_port "$svc"))"
        fi
        sleep 0.5
    done
    die_log "$logfile" "$svc did not answer on $HOST:$(service_port "$svc") within ${TIMEOUT}s"
}

# ---------------------------------------------------------------------------
# package installation
# ---------------------------------------------------------------------------

APT_UPDATED=0

is_debian_like() {
    [[ -f /etc/debian_version ]] && command -v apt-get >/dev/null 2>&1 &&
        command -v dpkg >/dev/null 2>&1
}

can_apt_install() {
    is_debian_like && [[ $(id -u) -eq 0 ]]
}

pkg_installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}

pkg_available() {
    local cand
    cand=$(apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | head -n 1)
    [[ -n $cand && $cand != "(none)" ]]
}

apt_update_once() {
    ((APT_UPDATED)) && return 0
    log "running apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update </dev/null >&2 ||
        die "apt-get update failed"
    APT_UPDATED=1
}

# apt_install REQUIRED... -- OPTIONAL...
# Optional packages that are not available are skipped with a warning.
apt_install() {
    local required=() optional=() pkg in_optional=0 to_install=() missing_avail=0
    for pkg in "$@"; do
        if [[ $pkg == -- ]]; then
            in_optional=1
            continue
        fi
        if ((in_optional)); then optional+=("$pkg"); else required+=("$pkg"); fi
    done
    for pkg in "${required[@]}" "${optional[@]}"; do
        pkg_available "$pkg" || missing_avail=1
    done
    ((missing_avail)) && apt_update_once
    for pkg in "${required[@]}"; do
        pkg_available "$pkg" || die "package '$pkg' is not available from the configured apt sources"
        to_install+=("$pkg")
    done
    for pkg in "${optional[@]}"; do
        if pkg_available "$pkg"; then
            to_install+=("$pkg")
        else
            warn "optional package '$pkg' is not available from apt; skipping it"
        fi
    done
    ((${#to_install[@]})) || return 0
    log "installing: ${to_install[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${to_install[@]}" </dev/null >&2; then
        if ((APT_UPDATED == 0)); then
            apt_update_once
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
                "${to_install[@]}" </dev/null >&2 || die "apt-get install ${to_install[*]} failed"
        else
            die "apt-get install ${to_install[*]} failed"
        fi
    fi
}

zk_installed() {
    [[ -r /usr/share/java/zookeeper.jar ]] && command -v java >/dev/null 2>&1
}

curator_installed() {
    [[ -r /usr/share/java/curator-recipes.jar ]] || pkg_installed libcurator-recipes-java
}

# Work out which OS packages the selected services need, and install them in
# one apt step.  Services that already answer only need their client tools.
install_missing_packages() {
    local svc required=() optional=() hints=()
    for svc in "$@"; do
        case $svc in
            redis)
                if ! redis_answers "$REDIS_PORT" && ! command -v redis-server >/dev/null 2>&1 &&
                    [[ " ${required[*]} " != *" redis-server "* ]]; then
                    required+=(redis-server)
                    hints+=("redis-server (Redis >= 6)")
                fi
                ;;
            redis-cluster | redis-sentinel)
                # redis-cli (package redis-tools, a dependency of redis-server)
                # is needed even to check a cluster or a Sentinel group we reuse;
                # a Sentinel is redis-server started with --sentinel.
                if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
                    if [[ " ${required[*]} " != *" redis-server "* ]]; then
                        required+=(redis-server)
                        hints+=("redis-server (Redis >= 6, with redis-cli)")
                    fi
                fi
                ;;
            zk-ensemble)
                if ! ensemble_answers && ! zk_installed &&
                    [[ " ${required[*]} " != *" zookeeper "* ]]; then
                    required+=(zookeeper)
                    hints+=("zookeeper (Apache ZooKeeper 3.8, with a Java runtime)")
                fi
                ;;
            zookeeper)
                if ! zk_answers "$ZK_PORT" && ! zk_installed; then
                    required+=(zookeeper)
                    hints+=("zookeeper (Apache ZooKeeper 3.8, with a Java runtime)")
                fi
                if is_debian_like && ! curator_installed; then
                    optional+=(libcurator-recipes-java)
                fi
                ;;
            mysql)
                if ! mysql_answers "$MYSQL_PORT"; then
                    if ! find_bin mariadbd mysqld >/dev/null || ! command -v mariadb-install-db >/dev/null 2>&1; then
                        required+=(mariadb-server)
                        hints+=("mariadb-server (MariaDB >= 10.3)")
                    fi
                fi
                if ! mysql_client_bin >/dev/null; then
                    required+=(mariadb-client)
                    hints+=("mariadb-client")
                fi
                ;;
            etcd | etcd-cluster)
                # etcdctl checks health, also of members we reuse.
                if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
                    if [[ " ${required[*]} " != *" etcd-server "* ]]; then
                        required+=(etcd-server etcd-client)
                        hints+=("etcd-server and etcd-client (etcd >= 3.4)")
                    fi
                fi
                ;;
            tools)
                if ! command -v protoc >/dev/null 2>&1; then
                    required+=(protobuf-compiler)
                    hints+=("protobuf-compiler (protoc, to build the etcd client)")
                fi
                # jq reads cargo's build messages: which test binaries scripts/test runs.
                if ! command -v jq >/dev/null 2>&1; then
                    required+=(jq)
                    hints+=("jq (scripts/test and scripts/stress list the test binaries with it)")
                fi
                # libfaketime runs a `dlock torture --clock-rate` worker on a drifting clock.
                if ! compgen -G '/usr/lib/*/faketime/libfaketimeMT.so.1' >/dev/null; then
                    required+=(libfaketime)
                    hints+=("libfaketime (a torture worker on a drifting clock)")
                fi
                # openssl makes the certificates of the etcd TLS test.
                if ! command -v openssl >/dev/null 2>&1; then
                    required+=(openssl)
                    hints+=("openssl (certificates for the TLS tests)")
                fi
                # protoc's well-known types (google/protobuf/descriptor.proto, ...), which
                # etcd's .proto files import; Debian ships them apart from protoc.
                if [[ ! -f /usr/include/google/protobuf/descriptor.proto && -z ${PROTOC_INCLUDE:-} ]]; then
                    required+=(libprotobuf-dev)
                    hints+=("libprotobuf-dev (protoc's well-known .proto files), or set PROTOC_INCLUDE")
                fi
                # The `sqlite-unbundled` feature (on in every --all-features build) generates
                # SQLite's bindings with libclang and links the system's libsqlite3.
                if [[ -z ${LIBCLANG_PATH:-} ]] && {
                    ! compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null ||
                        ! compgen -G '/usr/lib/llvm-*/lib/clang/*/include/stdarg.h' >/dev/null
                }; then
                    required+=(libclang-dev)
                    hints+=("libclang-dev (SQLite's bindings for the sqlite-unbundled feature), or set LIBCLANG_PATH")
                fi
                if ! pkg-config --exists sqlite3 2>/dev/null; then
                    required+=(libsqlite3-dev pkg-config)
                    hints+=("libsqlite3-dev and pkg-config (the system SQLite of the sqlite-unbundled feature)")
                fi
                ;;
            postgres)
                if ! postgres_answers "$POSTGRES_PORT" && ! postgres_bin_dir >/dev/null; then
                    required+=(postgresql)
                    hints+=("postgresql (PostgreSQL >= 12)")
                elif ! command -v psql >/dev/null 2>&1; then
                    required+=(postgresql-client)
                    hints+=("postgresql-client")
                fi
                ;;
        esac
    done
    if ((${#required[@]} == 0 && ${#optional[@]} == 0)); then
        return 0
    fi
    if can_apt_install; then
        apt_install "${required[@]}" -- "${optional[@]}"
        return 0
    fi
    if ((${#optional[@]})); then
        warn "Apache Curator jars not found (Debian package libcurator-recipes-java);" \
            "ZooKeeper interop tests may be skipped"
    fi
    if ((${#required[@]})); then
        local why="not running as root"
        is_debian_like || why="not a Debian/Ubuntu system (no apt-get)"
        log "cannot install missing servers automatically ($why)."
        log "please install: ${hints[*]}"
        is_debian_like && log "  e.g.: sudo apt-get install -y --no-install-recommends ${required[*]}"
        log "or start the services with docker: docker compose -f compose/docker-compose.yml up -d --wait"
        exit 1
    fi
}
