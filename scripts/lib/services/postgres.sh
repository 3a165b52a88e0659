# shellcheck shell=bash
# PostgreSQL: the cluster, its users and grants.
# Sourced by scripts/services, whose globals (ports, users, STATE_DIR) and helpers
# (scripts/lib/services/common.sh) it uses; not run on its own.

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

# The bin directory of the newest installed PostgreSQL server (Debian keeps
# initdb and postgres under /usr/lib/postgresql/<major>/bin, off the PATH).
postgres_bin_dir() {
    local dir
    dir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null |
        sort -V | tail -n 1)
    if [[ -n $dir && -x $dir/initdb && -x $dir/postgres ]]; then
        printf '%s' "$dir"
        return 0
    fi
    dir=$(dirname "$(find_bin initdb 2>/dev/null || printf '/nonexistent/x')")
    [[ -x $dir/initdb && -x $dir/postgres ]] || return 1
    printf '%s' "$dir"
}

# 0: a PostgreSQL server answers on the port.  Sends the protocol's SSLRequest
# and expects its one-byte answer ('S' or 'N'), so no login and no failed
# authentication ends up in the server's log.
# shellcheck disable=SC2016 # $0/$1 are expanded by the inner bash
postgres_answers() {
    local reply
    reply=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
        printf "\x00\x00\x00\x08\x04\xd2\x16\x2f" >&3; head -c 1 <&3' "$HOST" "$1" 2>/dev/null || true)
    [[ $reply == S || $reply == N ]]
}

# The OS user a server we start runs as: PostgreSQL refuses to run as root.
postgres_run_user() {
    if [[ $(id -u) -ne 0 ]]; then
        id -un
    elif id postgres >/dev/null 2>&1; then
        printf 'postgres'
    else
        die "postgres: running as root and there is no 'postgres' OS user to run the server as"
    fi
}

# Run a command as the server's OS user (exec'd in place, so $! is the server).
postgres_as_owner() {
    local user
    user=$(postgres_run_user)
    if [[ $user == "$(id -un)" ]]; then
        "$@"
    else
        setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups -- "$@"
    fi
}

# Run SQL as the admin found by postgres_find_admin.
postgres_admin_sql() {
    PGCONNECT_TIMEOUT=5 "${PG_ADMIN[@]}" -X -w -q -At -v ON_ERROR_STOP=1 -c "$1"
}

# Try one way of connecting as admin; succeeds if it reaches the server on our port.
postgres_try_admin() {
    local port
    port=$(PGCONNECT_TIMEOUT=5 "$@" -X -w -At -c 'SHOW port' 2>/dev/null) || return 1
    [[ $port == "$POSTGRES_PORT" ]] || return 1
    PG_ADMIN=("$@")
}

postgres_find_admin() {
    local ours_socket_dir=$1
    if [[ -n $ours_socket_dir && -S $ours_socket_dir/.s.PGSQL.$POSTGRES_PORT ]] &&
        postgres_try_admin psql -h "$ours_socket_dir" -p "$POSTGRES_PORT" -U postgres -d postgres; then
        return 0
    fi
    if [[ -n ${DLOCK_POSTGRES_ADMIN_URL:-} ]] && postgres_try_admin psql "$DLOCK_POSTGRES_ADMIN_URL"; then
        return 0
    fi
    # The postgres role over TCP (trust authentication, as on CI machines).
    if postgres_try_admin psql -h "$HOST" -p "$POSTGRES_PORT" -U postgres -d postgres; then
        return 0
    fi
    # Debian stock: the postgres OS user over the default unix socket (peer authentication).
    if [[ $(id -u) -eq 0 ]] && id postgres >/dev/null 2>&1 &&
        postgres_try_admin runuser -u postgres -- psql -p "$POSTGRES_PORT" -d postgres; then
        return 0
    fi
    return 1
}

postgres_verify_user() {
    PGPASSWORD=$PG_PASSWORD PGCONNECT_TIMEOUT=5 psql -X -w -At -h "$HOST" -p "$POSTGRES_PORT" \
        -U "$PG_USER" -d "$PG_DB" -c 'SELECT 1' >/dev/null 2>&1
}

# The role and database the tests use, owned by that role (PostgreSQL 15 lets only a
# database's owner create tables in its public schema).
postgres_setup_user() {
    local ours_socket_dir=$1 out
    if ! postgres_find_admin "$ours_socket_dir"; then
        if postgres_verify_user; then
            warn "postgres: cannot log in as an admin to $HOST:$POSTGRES_PORT, but" \
                "$PG_USER@$PG_DB already works; not checking it further" \
                "(set DLOCK_POSTGRES_ADMIN_URL to let this script manage it)"
            return 0
        fi
        die "postgres: the server on $HOST:$POSTGRES_PORT was reused, but neither the postgres" \
            "role over TCP nor the postgres OS user over the unix socket could log in, so the" \
            "'$PG_DB' database and the '$PG_USER' role cannot be created. Set" \
            "DLOCK_POSTGRES_ADMIN_URL, or create them yourself:" \
            "CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD'; CREATE DATABASE $PG_DB OWNER $PG_USER;"
    fi
    local role_sql="DO \$\$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
            CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD';
        END IF;
        ALTER ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD';
    END \$\$;"
    out=$(postgres_admin_sql "$role_sql" 2>&1) ||
        die "postgres: creating role '$PG_USER' failed: $out"
    # CREATE DATABASE cannot run inside a DO block.
    if [[ $(postgres_admin_sql "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" 2>&1) != 1 ]]; then
        out=$(postgres_admin_sql "CREATE DATABASE $PG_DB OWNER $PG_USER" 2>&1) ||
            die "postgres: creating database '$PG_DB' failed: $out"
    fi
    out=$(postgres_admin_sql "ALTER DATABASE $PG_DB OWNER TO $PG_USER" 2>&1) ||
        die "postgres: giving database '$PG_DB' to '$PG_USER' failed: $out"
    if ! postgres_verify_user; then
        out=$(PGPASSWORD=$PG_PASSWORD PGCONNECT_TIMEOUT=5 psql -X -w -h "$HOST" -p "$POSTGRES_PORT" \
            -U "$PG_USER" -d "$PG_DB" -c 'SELECT 1' 2>&1 || true)
        die "postgres: role '$PG_USER' still cannot log in over TCP to $HOST:$POSTGRES_PORT/$PG_DB: $out"
    fi
    log "postgres: database '$PG_DB' and role '$PG_USER' are ready on $HOST:$POSTGRES_PORT"
}

postgres_up() {
    local name pidfile logfile dir datadir pid bindir user
    name=$(instance_name postgres)
    pidfile=$(service_pidfile postgres)
    logfile=$(service_logfile postgres)
    dir=$STATE_DIR/$name
    datadir=$dir/data
    local pattern="-D $datadir"

    if postgres_answers "$POSTGRES_PORT"; then
        if pid=$(our_pid "$pidfile" "$pattern"); then
            log "postgres: already running on $HOST:$POSTGRES_PORT (started by us, pid $pid)"
            postgres_setup_user "$dir"
        else
            log "postgres: reusing the server already answering on $HOST:$POSTGRES_PORT"
            postgres_setup_user ""
        fi
        return 0
    fi
    if our_pid "$pidfile" "$pattern" >/dev/null; then
        log "postgres: our server is not answering yet; waiting"
        wait_until_answers postgres "$pidfile" "$logfile"
        postgres_setup_user "$dir"
        return 0
    fi
    if tcp_open "$POSTGRES_PORT"; then
        die "postgres: port $HOST:$POSTGRES_PORT is in use by something that is not PostgreSQL"
    fi
    bindir=$(postgres_bin_dir) || die "postgres: initdb and postgres are not installed"
    user=$(postgres_run_user)
    # Unix socket paths are limited to ~107 bytes.
    if ((${#dir} > 80)); then
        die "postgres: socket directory $dir is too long; set DLOCK_SERVICES_DIR to a shorter directory"
    fi
    mkdir -p "$dir"
    chown "$user" "$dir"
    if [[ ! -f $dir/.initialized ]]; then
        rm -rf "$datadir"
        log "postgres: initialising a new cluster in $datadir (as $user)"
        # Trust on loopback only: a throwaway test server, listening on 127.0.0.1 alone.
        if ! postgres_as_owner "$bindir/initdb" -D "$datadir" -U postgres -A trust -E UTF8 \
            --no-sync </dev/null >>"$logfile" 2>&1; then
            die_log "$logfile" "postgres: $bindir/initdb failed"
        fi
        touch "$dir/.initialized"
    fi

    log "postgres: starting $bindir/postgres on $HOST:$POSTGRES_PORT (data in $datadir, log $logfile)"
    rm -f "$pidfile"
    touch "$logfile"
    chown "$user" "$logfile"
    local launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    if [[ $user != "$(id -un)" ]]; then
        launcher+=(setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups --)
    fi
    "${launcher[@]}" nohup "$bindir/postgres" -D "$datadir" -p "$POSTGRES_PORT" -k "$dir" \
        -c listen_addresses="$HOST" -c max_connections=400 -c fsync=off \
        -c synchronous_commit="$POSTGRES_SYNC" -c full_page_writes=off \
        </dev/null >>"$logfile" 2>&1 &
    pid=$!
    wait_for_exec "$pid" "$pattern"
    printf '%s\n' "$pid" >"$pidfile"
    wait_until_answers postgres "$pidfile" "$logfile"
    pid=$(our_pid "$pidfile" "$pattern") || die_log "$logfile" "postgres: server answers but its pid file $pidfile is stale"
    log "postgres: up on $HOST:$POSTGRES_PORT (pid $pid)"
    postgres_setup_user "$dir"
}
