# shellcheck shell=bash
# MariaDB (MySQL): the server, its users and grants.
# Sourced by scripts/services, whose globals (ports, users, STATE_DIR) and helpers
# (scripts/lib/services/common.sh) it uses; not run on its own.

# ---------------------------------------------------------------------------
# MariaDB
# ---------------------------------------------------------------------------

MYSQL_ADMIN_ARGS=()
MYSQL_ADMIN_PWD=

# Run SQL as the admin found by mysql_find_admin.
mysql_admin_sql() {
    local client
    client=$(mysql_client_bin)
    MYSQL_PWD=$MYSQL_ADMIN_PWD "$client" "${MYSQL_ADMIN_ARGS[@]}" --batch --skip-column-names -e "$1"
}

# Try one way of connecting as admin; succeeds if it reaches the server on our port.
mysql_try_admin() {
    local pwd=$1 client port
    shift
    client=$(mysql_client_bin)
    port=$(MYSQL_PWD=$pwd "$client" "$@" --connect-timeout=5 --batch --skip-column-names \
        -e 'SELECT @@port' 2>/dev/null) || return 1
    if [[ $port != "$MYSQL_PORT" ]]; then
        return 1
    fi
    MYSQL_ADMIN_ARGS=("$@")
    MYSQL_ADMIN_PWD=$pwd
}

mysql_find_admin() {
    local ours_socket=$1
    if [[ -n $ours_socket && -S $ours_socket ]] &&
        mysql_try_admin "" --socket="$ours_socket" -uroot; then
        return 0
    fi
    if [[ -n ${DLOCK_MYSQL_ROOT_PASSWORD:-} ]] &&
        mysql_try_admin "$DLOCK_MYSQL_ROOT_PASSWORD" --protocol=TCP -h"$HOST" -P"$MYSQL_PORT" -uroot; then
        return 0
    fi
    # Debian stock: root via the default unix socket (unix_socket auth).
    if mysql_try_admin "" -uroot; then
        return 0
    fi
    # root without a password over TCP.
    if mysql_try_admin "" --protocol=TCP -h"$HOST" -P"$MYSQL_PORT" -uroot; then
        return 0
    fi
    return 1
}

mysql_verify_user() {
    local client
    client=$(mysql_client_bin)
    MYSQL_PWD=$MYSQL_PASSWORD "$client" --protocol=TCP -h"$HOST" -P"$MYSQL_PORT" \
        -u"$MYSQL_USER" --connect-timeout=5 --batch --skip-column-names \
        -e 'SELECT 1' "$MYSQL_DB" >/dev/null 2>&1
}

# A second user whose statements MariaDB ends after 1 s (a per-user MAX_STATEMENT_TIME, as
# managed services set one), for the test that dlock's waits are not such statements
# (DLOCK_MYSQL_TIMED_URL).
mysql_setup_timed_user() {
    local sql= host
    for host in 127.0.0.1 localhost ::1; do
        sql+="CREATE USER IF NOT EXISTS '$MYSQL_TIMED_USER'@'$host' IDENTIFIED BY '$MYSQL_PASSWORD';"
        sql+="ALTER USER '$MYSQL_TIMED_USER'@'$host' IDENTIFIED BY '$MYSQL_PASSWORD' WITH MAX_STATEMENT_TIME 1;"
        sql+="GRANT ALL PRIVILEGES ON \`$MYSQL_DB\`.* TO '$MYSQL_TIMED_USER'@'$host';"
    done
    mysql_admin_sql "$sql" >/dev/null 2>&1 ||
        warn "mysql: could not create the user $MYSQL_TIMED_USER with a MAX_STATEMENT_TIME" \
            "(MariaDB only); the test that uses DLOCK_MYSQL_TIMED_URL will fail"
}

mysql_setup_user() {
    local ours_socket=$1 out host
    if ! mysql_find_admin "$ours_socket"; then
        if mysql_verify_user; then
            warn "mysql: cannot log in as root to the server on $HOST:$MYSQL_PORT, but" \
                "$MYSQL_USER@$MYSQL_DB already works; not checking its privileges" \
                "(set DLOCK_MYSQL_ROOT_PASSWORD to let this script manage it)"
            return 0
        fi
        die "mysql: the server on $HOST:$MYSQL_PORT was reused, but it rejected root over the" \
            "unix socket (mariadb -uroot) and over TCP, so the '$MYSQL_DB' database and the" \
            "'$MYSQL_USER' user cannot be created. Run this script as a user that can administer" \
            "it (e.g. sudo), set DLOCK_MYSQL_ROOT_PASSWORD, or create them yourself:" \
            "CREATE DATABASE $MYSQL_DB; CREATE USER '$MYSQL_USER'@'127.0.0.1' IDENTIFIED BY '$MYSQL_PASSWORD';" \
            "GRANT ALL ON $MYSQL_DB.* TO '$MYSQL_USER'@'127.0.0.1'; GRANT PROCESS ON *.* TO '$MYSQL_USER'@'127.0.0.1';"
    fi
    local sql="CREATE DATABASE IF NOT EXISTS \`$MYSQL_DB\`;"
    for host in 127.0.0.1 localhost ::1; do
        sql+="CREATE USER IF NOT EXISTS '$MYSQL_USER'@'$host' IDENTIFIED BY '$MYSQL_PASSWORD';"
        sql+="ALTER USER '$MYSQL_USER'@'$host' IDENTIFIED BY '$MYSQL_PASSWORD';"
        sql+="GRANT ALL PRIVILEGES ON \`$MYSQL_DB\`.* TO '$MYSQL_USER'@'$host';"
        sql+="GRANT PROCESS ON *.* TO '$MYSQL_USER'@'$host';"
    done
    if ! out=$(mysql_admin_sql "$sql" 2>&1); then
        die "mysql: creating database '$MYSQL_DB' / user '$MYSQL_USER' failed: $out"
    fi
    # Killing other sessions: CONNECTION ADMIN (MariaDB >= 10.5), CONNECTION_ADMIN
    # (MySQL 8), or SUPER (older servers).
    local priv granted=0
    for priv in 'CONNECTION ADMIN' 'CONNECTION_ADMIN' 'SUPER'; do
        sql=
        for host in 127.0.0.1 localhost ::1; do
            sql+="GRANT $priv ON *.* TO '$MYSQL_USER'@'$host';"
        done
        if mysql_admin_sql "$sql" >/dev/null 2>&1; then
            granted=1
            break
        fi
    done
    ((granted)) || warn "mysql: could not grant CONNECTION ADMIN/SUPER to $MYSQL_USER (KILL of other users' sessions will fail)"
    mysql_setup_timed_user
    mysql_admin_sql 'FLUSH PRIVILEGES;' >/dev/null 2>&1 || true
    if ! mysql_verify_user; then
        local client
        client=$(mysql_client_bin)
        out=$(MYSQL_PWD=$MYSQL_PASSWORD "$client" --protocol=TCP -h"$HOST" -P"$MYSQL_PORT" \
            -u"$MYSQL_USER" --connect-timeout=5 -e 'SELECT 1' "$MYSQL_DB" 2>&1 || true)
        die "mysql: user '$MYSQL_USER' still cannot log in over TCP to $HOST:$MYSQL_PORT/$MYSQL_DB: $out"
    fi
    log "mysql: database '$MYSQL_DB' and user '$MYSQL_USER' are ready on $HOST:$MYSQL_PORT"
}

mysql_up() {
    local name pidfile logfile dir datadir socket pid mariadbd install_db
    name=$(instance_name mysql)
    pidfile=$(service_pidfile mysql)
    logfile=$(service_logfile mysql)
    dir=$STATE_DIR/$name
    datadir=$dir/data
    socket=$dir/mysqld.sock
    local pattern="--datadir=$datadir"

    if mysql_answers "$MYSQL_PORT"; then
        if pid=$(our_pid "$pidfile" "$pattern"); then
            log "mysql: already running on $HOST:$MYSQL_PORT (started by us, pid $pid)"
            mysql_setup_user "$socket"
        else
            log "mysql: reusing the server already answering on $HOST:$MYSQL_PORT"
            mysql_setup_user ""
        fi
        return 0
    fi
    if our_pid "$pidfile" "$pattern" >/dev/null; then
        log "mysql: our server is not answering yet; waiting"
        wait_until_answers mysql "$pidfile" "$logfile"
        mysql_setup_user "$socket"
        return 0
    fi
    if tcp_open "$MYSQL_PORT"; then
        die "mysql: port $HOST:$MYSQL_PORT is in use by something that is not MySQL/MariaDB"
    fi
    mariadbd=$(find_bin mariadbd mysqld) || die "mysql: mariadbd is not installed"
    install_db=$(find_bin mariadb-install-db mysql_install_db) || die "mysql: mariadb-install-db is not installed"

    # Unix socket paths are limited to ~107 bytes.
    if ((${#socket} > 100)); then
        die "mysql: socket path $socket is too long; set DLOCK_SERVICES_DIR to a shorter directory"
    fi
    local run_user
    run_user=$(id -un)
    mkdir -p "$dir"
    if [[ ! -f $dir/.initialized ]]; then
        rm -rf "$datadir"
        mkdir -p "$datadir"
        local help args=(--no-defaults --user="$run_user" --datadir="$datadir")
        help=$("$install_db" --help 2>&1 || true)
        [[ $help == *auth-root-authentication-method* ]] && args+=(--auth-root-authentication-method=normal)
        [[ $help == *skip-test-db* ]] && args+=(--skip-test-db)
        # Debian's mariadb-install-db finds its files under /usr when basedir is unset,
        # but --no-defaults hides any basedir from my.cnf: pass it explicitly.
        [[ $help == *--basedir* && -d /usr/share/mysql ]] && args+=(--basedir=/usr)
        log "mysql: initialising a new data directory in $datadir"
        if ! "$install_db" "${args[@]}" </dev/null >>"$logfile" 2>&1; then
            die_log "$logfile" "mysql: $install_db ${args[*]} failed"
        fi
        touch "$dir/.initialized"
    fi

    log "mysql: starting $mariadbd on $HOST:$MYSQL_PORT (data in $datadir, log $logfile)"
    rm -f "$pidfile" "$socket"
    local launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    # --no-defaults must come first; it keeps /etc/mysql/my.cnf out of our server.
    "${launcher[@]}" nohup "$mariadbd" --no-defaults \
        --user="$run_user" \
        --datadir="$datadir" \
        --socket="$socket" \
        --port="$MYSQL_PORT" \
        --bind-address="$HOST" \
        --pid-file="$pidfile" \
        --log-error="$logfile" \
        --max-connections=500 \
        --skip-log-bin \
        --character-set-server=utf8mb4 \
        --collation-server=utf8mb4_general_ci \
        </dev/null >>"$logfile" 2>&1 &
    pid=$!
    wait_for_exec "$pid" "$pattern"
    # mariadbd writes its own pid file once it is up; until then record ours.
    printf '%s\n' "$pid" >"$pidfile"
    wait_until_answers mysql "$pidfile" "$logfile"

    # Readiness as the brief defines it: mariadb-admin ping over our socket.
    local admin deadline
    admin=$(mysql_admin_bin) || die "mysql: mariadb-admin is not installed"
    deadline=$((SECONDS + TIMEOUT))
    until "$admin" --no-defaults --socket="$socket" -uroot ping >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die_log "$logfile" "mysql: mariadb-admin ping over $socket does not answer"
        sleep 0.5
    done
    pid=$(our_pid "$pidfile" "$pattern") || die_log "$logfile" "mysql: server answers but its pid file $pidfile is stale"
    log "mysql: up on $HOST:$MYSQL_PORT (pid $pid)"
    mysql_setup_user "$socket"
}
