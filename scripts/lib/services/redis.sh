# shellcheck shell=bash
# Redis: one server, a Cluster of three masters, a Sentinel set.
# Sourced by scripts/services, whose globals (ports, users, STATE_DIR) and helpers
# (scripts/lib/services/common.sh) it uses; not run on its own.

# ---------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------

redis_up() {
    local name pidfile logfile datadir pid reply
    name=$(instance_name redis)
    pidfile=$(service_pidfile redis)
    logfile=$(service_logfile redis)
    datadir=$STATE_DIR/$name

    if redis_answers "$REDIS_PORT"; then
        if pid=$(our_pid "$pidfile" redis-server); then
            log "redis: already running on $HOST:$REDIS_PORT (started by us, pid $pid)"
        else
            log "redis: reusing the server already answering on $HOST:$REDIS_PORT"
        fi
        return 0
    fi
    reply=$(tcp_talk "$REDIS_PORT" 'PING\r\n' line)
    if [[ $reply == -* ]]; then
        die "redis: the server on $HOST:$REDIS_PORT answered '$reply' (needs a password?); tests need an unauthenticated Redis"
    fi
    if tcp_open "$REDIS_PORT"; then
        die "redis: port $HOST:$REDIS_PORT is in use by something that is not Redis"
    fi
    command -v redis-server >/dev/null 2>&1 || die "redis: redis-server is not installed"

    mkdir -p "$datadir"
    rm -f "$pidfile"
    log "redis: starting redis-server on $HOST:$REDIS_PORT (data in $datadir, log $logfile)"
    # redis-server writes --logfile itself; its early stdout/stderr go there too.
    # shellcheck disable=SC2094
    if ! redis-server --daemonize yes --bind "$HOST" --port "$REDIS_PORT" \
        --save "" --appendonly "$REDIS_AOF" --appendfsync always --dir "$datadir" \
        --pidfile "$pidfile" --logfile "$logfile" </dev/null >>"$logfile" 2>&1; then
        die_log "$logfile" "redis: redis-server failed to start"
    fi
    wait_until_answers redis "$pidfile" "$logfile"
    # The pid file is written by redis itself; make sure it is there.
    local i
    for ((i = 0; i < 20; i++)); do
        [[ -s $pidfile ]] && break
        sleep 0.25
    done
    pid=$(our_pid "$pidfile" redis-server) || die_log "$logfile" "redis: answering, but no pid file at $pidfile"
    log "redis: up on $HOST:$REDIS_PORT (pid $pid)"
}

# ---------------------------------------------------------------------------
# Redis Cluster (three masters on consecutive ports, no replicas)
# ---------------------------------------------------------------------------

CLUSTER_SLOTS=16384

cluster_ports() {
    printf '%s %s %s' "$REDIS_CLUSTER_PORT" "$((REDIS_CLUSTER_PORT + 1))" "$((REDIS_CLUSTER_PORT + 2))"
}

cluster_node_dir() {
    printf '%s/redis-cluster/%s' "$STATE_DIR" "$1"
}

cluster_cli() {
    local port=$1
    shift
    timeout 5 redis-cli -h "$HOST" -p "$port" "$@" 2>/dev/null | tr -d '\r'
}

# Value of field $2 in `cluster info` of the node on port $1 (empty if none).
cluster_info_field() {
    local port=$1 field=$2
    cluster_cli "$port" cluster info | sed -n "s/^$field://p" | head -n 1
}

# 0: the node on port $1 sees a healthy cluster of exactly three masters that
# covers every slot and contains all three of our ports.
cluster_node_healthy() {
    local port=$1 info nodes masters p
    info=$(cluster_cli "$port" cluster info) || return 1
    [[ $info == *cluster_state:ok* ]] || return 1
    [[ $info == *"cluster_slots_assigned:$CLUSTER_SLOTS"* ]] || return 1
    [[ $info == *cluster_size:3* ]] || return 1
    nodes=$(cluster_cli "$port" cluster nodes) || return 1
    masters=$(awk '$3 ~ /master/ && $3 !~ /fail/' <<<"$nodes" | wc -l)
    ((masters == 3)) || return 1
    for p in $(cluster_ports); do
        [[ $nodes == *":$p@"* ]] || return 1
    done
}

# 0: all three nodes answer PING and the base node reports a healthy cluster.
cluster_answers() {
    local p
    for p in $(cluster_ports); do
        redis_answers "$p" || return 1
    done
    command -v redis-cli >/dev/null 2>&1 || return 1
    cluster_node_healthy "$REDIS_CLUSTER_PORT"
}

# 0: every node reports cluster_state:ok.
cluster_all_ok() {
    local p
    for p in $(cluster_ports); do
        [[ $(cluster_info_field "$p" cluster_state) == ok ]] || return 1
    done
}

# Stop the nodes of ours that are running (pid files under the state dir).
cluster_stop_ours() {
    local p pidfile pid stopped=0
    for p in $(cluster_ports); do
        pidfile=$(cluster_node_dir "$p")/redis.pid
        if pid=$(our_pid "$pidfile" redis-server); then
            stop_pid "redis-cluster:$p" "$pid" redis-server
            rm -f "$pidfile"
            stopped=$((stopped + 1))
        fi
    done
    printf '%s' "$stopped"
}

# Stop whatever nodes we started in this run, show a log, and die.
cluster_abort() {
    local logfile=$1
    shift
    show_log "$logfile"
    log "redis-cluster: stopping the nodes started by this run"
    cluster_stop_ours >/dev/null
    die "$@"
}

# Start the node on port $1 as a daemon in its directory; a nodes.conf there (left by a
# crash) makes it rejoin with its identity and slots.
cluster_start_node() {
    local p=$1 dir logfile
    dir=$(cluster_node_dir "$p")
    logfile=$dir/redis.log
    log "redis-cluster: starting redis-server on $HOST:$p (dir $dir)"
    # shellcheck disable=SC2094 # redis-server appends to --logfile itself
    redis-server --port "$p" --bind "$HOST" \
        --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-node-timeout 5000 --save "" --appendonly "$REDIS_AOF" --appendfsync always \
        --daemonize yes --dir "$dir" \
        --pidfile "$dir/redis.pid" --logfile "$logfile" </dev/null >>"$logfile" 2>&1
}

redis_cluster_up() {
    local ports p dir pid answering=() busy=() ours=() reply
    read -r -a ports <<<"$(cluster_ports)"
    local range="$HOST:${ports[0]}-${ports[2]}"

    for p in "${ports[@]}"; do
        if redis_answers "$p"; then
            answering+=("$p")
        elif tcp_open "$p"; then
            busy+=("$p")
        fi
        our_pid "$(cluster_node_dir "$p")/redis.pid" redis-server >/dev/null && ours+=("$p")
    done

    if ((${#answering[@]} == 3)); then
        if cluster_node_healthy "${ports[0]}"; then
            if ((${#ours[@]} == 3)); then
                log "redis-cluster: already running on $range (started by us)"
            else
                log "redis-cluster: reusing the cluster already answering on $range"
            fi
            return 0
        fi
        if ((${#ours[@]} == 3)); then
            # Ours but not (yet) healthy, e.g. still converging: wait for it.
            log "redis-cluster: our nodes on $range answer but the cluster is not ok yet; waiting"
            local deadline=$((SECONDS + TIMEOUT))
            until cluster_all_ok && cluster_node_healthy "${ports[0]}"; do
                ((SECONDS < deadline)) ||
                    die "redis-cluster: our nodes on $range did not form a healthy cluster within ${TIMEOUT}s;" \
                        "run 'scripts/services down redis-cluster' and try again"
                sleep 0.5
            done
            log "redis-cluster: up on $range"
            return 0
        fi
        reply=$(cluster_cli "${ports[0]}" cluster info | head -n 1 || true)
        die "redis-cluster: $range all answer PING but are not a healthy 3-master cluster covering all" \
            "$CLUSTER_SLOTS slots ('cluster info' on ${ports[0]}: ${reply:-no reply});" \
            "not touching them. Stop them or set DLOCK_REDIS_CLUSTER_PORT to another base port"
    fi
    if ((${#answering[@]} || ${#busy[@]})); then
        local msg="redis-cluster: only some of the ports $range are in use"
        ((${#answering[@]})) && msg+=" (Redis answers on ${answering[*]})"
        ((${#busy[@]})) && msg+=" (something that is not Redis listens on ${busy[*]})"
        msg+="; not touching them."
        if ((${#ours[@]})); then
            msg+=" Nodes ${ours[*]} were started by this script: run 'scripts/services down redis-cluster' and try again"
        else
            msg+=" Stop them or set DLOCK_REDIS_CLUSTER_PORT to another base port"
        fi
        die "$msg"
    fi
    if ((${#ours[@]})); then
        die "redis-cluster: our redis-server for port(s) ${ours[*]} is running but not answering;" \
            "run 'scripts/services down redis-cluster' and try again"
    fi
    command -v redis-server >/dev/null 2>&1 || die "redis-cluster: redis-server is not installed"
    command -v redis-cli >/dev/null 2>&1 || die "redis-cluster: redis-cli is not installed"

    local logfile
    for p in "${ports[@]}"; do
        dir=$(cluster_node_dir "$p")
        logfile=$dir/redis.log
        mkdir -p "$dir"
        # A previous run's cluster state would make this node refuse to join.
        rm -rf "$dir/nodes.conf" "$dir/redis.pid" "$dir/dump.rdb" "$dir/appendonlydir" "$dir/appendonly.aof"
        cluster_start_node "$p" ||
            cluster_abort "$logfile" "redis-cluster: redis-server on port $p failed to start"
    done

    local deadline=$((SECONDS + TIMEOUT)) pidfile
    for p in "${ports[@]}"; do
        dir=$(cluster_node_dir "$p")
        pidfile=$dir/redis.pid
        until redis_answers "$p"; do
            if [[ -f $pidfile ]] && ! our_pid "$pidfile" redis-server >/dev/null; then
                cluster_abort "$dir/redis.log" "redis-cluster: redis-server on port $p exited during start-up"
            fi
            ((SECONDS < deadline)) ||
                cluster_abort "$dir/redis.log" "redis-cluster: $HOST:$p did not answer within ${TIMEOUT}s"
            sleep 0.25
        done
        # The pid file is written by redis itself; make sure it is there.
        until our_pid "$pidfile" redis-server >/dev/null; do
            ((SECONDS < deadline)) ||
                cluster_abort "$dir/redis.log" "redis-cluster: $HOST:$p answers, but no pid file at $pidfile"
            sleep 0.25
        done
    done

    local create_log=$STATE_DIR/redis-cluster/create-${ports[0]}.log addrs=()
    for p in "${ports[@]}"; do
        addrs+=("$HOST:$p")
    done
    log "redis-cluster: redis-cli --cluster create ${addrs[*]} --cluster-replicas 0 (log $create_log)"
    if ! timeout "$TIMEOUT" redis-cli --cluster create "${addrs[@]}" \
        --cluster-replicas 0 --cluster-yes </dev/null >"$create_log" 2>&1; then
        cluster_abort "$create_log" "redis-cluster: redis-cli --cluster create failed"
    fi

    deadline=$((SECONDS + TIMEOUT))
    until cluster_all_ok; do
        if ((SECONDS >= deadline)); then
            for p in "${ports[@]}"; do
                reply=$(cluster_info_field "$p" cluster_state || true)
                log "redis-cluster: $HOST:$p cluster_state:${reply:-?}"
            done
            cluster_abort "$create_log" "redis-cluster: the cluster on $range did not reach cluster_state:ok within ${TIMEOUT}s"
        fi
        sleep 0.5
    done
    local pids=()
    for p in "${ports[@]}"; do
        pids+=("$(our_pid "$(cluster_node_dir "$p")/redis.pid" redis-server)")
    done
    log "redis-cluster: up on $range (3 masters, pids ${pids[*]})"
}

# The port of the master that serves slot 0, as the node on port $1 sees it (empty if none).
cluster_slot0_port() {
    cluster_cli "$1" cluster nodes | awk '$3 ~ /master/ && $3 !~ /fail/ {
        for (i = 9; i <= NF; i++) if ($i ~ /^0(-|$)/) { split($2, a, "[:@]"); print a[2]; exit }
    }'
}

# 0: every node reports cluster_state:ok and sees three healthy masters.
cluster_all_healthy() {
    local p
    cluster_all_ok || return 1
    for p in $(cluster_ports); do
        cluster_node_healthy "$p" || return 1
    done
}

# A server fault: SIGKILL the master that serves slot 0 (always that one, so a seed replays
# the same fault), start it again from its directory, where its nodes.conf keeps its
# identity and slots, and wait until every node says cluster_state:ok. The cluster has no
# replicas: this is a node crash and restart, not a failover; its slots are unserved until it
# is back, and it comes back empty, its keys and fencing counters lost, unless it was started
# with DLOCK_REDIS_AOF=yes.
cluster_crash() {
    local p port dir pid pattern deadline
    for p in $(cluster_ports); do
        our_pid "$(cluster_node_dir "$p")/redis.pid" redis-server >/dev/null ||
            die "redis-cluster: the node on $HOST:$p was not started by this script; crash only stops its own"
    done
    cluster_all_healthy || die "redis-cluster: not healthy before the crash; run up first"
    port=$(cluster_slot0_port "$REDIS_CLUSTER_PORT")
    [[ -n $port ]] || die "redis-cluster: no master serves slot 0 (cluster nodes on $HOST:$REDIS_CLUSTER_PORT)"
    dir=$(cluster_node_dir "$port")
    # A pid reused by another redis-server (a Sentinel, another node) does not match.
    pattern="redis-server $HOST:$port"
    pid=$(our_pid "$dir/redis.pid" "$pattern") ||
        die "redis-cluster: the master of slot 0 on $HOST:$port was not started by this script"
    log "redis-cluster: crashing the master of slot 0 on $HOST:$port (no replica takes over: it restarts)"
    kill_ours "redis-cluster:$port" "$pid" "$pattern"
    rm -f "$dir/redis.pid"
    cluster_start_node "$port" || die_log "$dir/redis.log" "redis-cluster: redis-server on port $port failed to start"
    deadline=$((SECONDS + TIMEOUT))
    until redis_answers "$port" && our_pid "$dir/redis.pid" "$pattern" >/dev/null; do
        ((SECONDS < deadline)) || die_log "$dir/redis.log" "redis-cluster: $HOST:$port did not answer within ${TIMEOUT}s"
        sleep 0.1
    done
    until cluster_all_healthy; do
        ((SECONDS < deadline)) || die_log "$dir/redis.log" \
            "redis-cluster: not cluster_state:ok on all three nodes within ${TIMEOUT}s of the crash"
        sleep 0.1
    done
    log "redis-cluster: $HOST:$port is back (pid $(our_pid "$dir/redis.pid" "$pattern")); cluster_state:ok on all three"
}

# ---------------------------------------------------------------------------
# Redis Sentinel (a master, its replica, three Sentinels watching them)
# ---------------------------------------------------------------------------

SENTINEL_MASTER=dlock

sentinel_data_ports() {
    printf '%s %s' "$REDIS_SENTINEL_DATA_PORT" "$((REDIS_SENTINEL_DATA_PORT + 1))"
}

sentinel_ports() {
    printf '%s %s %s' "$REDIS_SENTINEL_PORT" "$((REDIS_SENTINEL_PORT + 1))" "$((REDIS_SENTINEL_PORT + 2))"
}

sentinel_dir() { printf '%s/redis-sentinel/%s' "$STATE_DIR" "$1"; }

sentinel_pidfile() { printf '%s/redis.pid' "$(sentinel_dir "$1")"; }

# The master's port as the Sentinel on port $1 knows it (after a failover, the
# master may be the server that started as the replica).
sentinel_master_port() {
    timeout 3 redis-cli -h "$HOST" -p "$1" sentinel get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null |
        sed -n 2p
}

# Healthy: every Sentinel reaches a quorum for the master, and the master has
# its replica online.
sentinel_healthy() {
    local p master
    for p in $(sentinel_ports); do
        timeout 3 redis-cli -h "$HOST" -p "$p" sentinel ckquorum "$SENTINEL_MASTER" 2>/dev/null |
            grep -q '^OK' || return 1
    done
    master=$(sentinel_master_port "$REDIS_SENTINEL_PORT")
    [[ -n $master ]] || return 1
    timeout 3 redis-cli -h "$HOST" -p "$master" info replication 2>/dev/null |
        grep -q '^slave0:.*state=online'
}

# Start the redis-server on data port $1 (a replica of port $2 when given).
sentinel_start_data() {
    local p=$1 of=${2:-} dir replica=()
    dir=$(sentinel_dir "$p")
    mkdir -p "$dir"
    rm -f "$dir/redis.pid" "$dir/dump.rdb"
    [[ -n $of ]] && replica=(--replicaof "$HOST" "$of")
    log "redis-sentinel: starting redis-server on $HOST:$p${of:+ (replica of $of)}"
    # shellcheck disable=SC2094 # redis-server appends to --logfile itself
    redis-server --port "$p" --bind "$HOST" --save "" --appendonly no \
        --repl-diskless-sync-delay 0 --daemonize yes --dir "$dir" "${replica[@]}" \
        --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" </dev/null >>"$dir/redis.log" 2>&1 ||
        sentinel_abort "$dir/redis.log" "redis-sentinel: redis-server on port $p failed to start"
}

# Start the Sentinel on port $1, watching the master on port $2.  A Sentinel
# rewrites its configuration file, so each start writes a fresh one.
sentinel_start_sentinel() {
    local p=$1 master=$2 dir
    dir=$(sentinel_dir "$p")
    mkdir -p "$dir"
    rm -f "$dir/redis.pid"
    printf '%s\n' \
        "port $p" \
        "bind $HOST" \
        "daemonize yes" \
        "dir $dir" \
        "pidfile $dir/redis.pid" \
        "logfile $dir/redis.log" \
        "sentinel monitor $SENTINEL_MASTER $HOST $master 2" \
        "sentinel down-after-milliseconds $SENTINEL_MASTER 2000" \
        "sentinel failover-timeout $SENTINEL_MASTER 10000" >"$dir/sentinel.conf"
    log "redis-sentinel: starting a Sentinel on $HOST:$p"
    redis-server "$dir/sentinel.conf" --sentinel </dev/null >>"$dir/redis.log" 2>&1 ||
        sentinel_abort "$dir/redis.log" "redis-sentinel: the Sentinel on port $p failed to start"
}

# Stop what this script started of the group, show log $1, and die with the rest.
sentinel_abort() {
    local logfile=$1
    shift
    sentinel_down
    die_log "$logfile" "$@"
}

redis_sentinel_up() {
    local p answering=() ours=() all range deadline
    read -r -a all <<<"$(sentinel_data_ports) $(sentinel_ports)"
    range="$HOST:$(service_port redis-sentinel) (data $(sentinel_data_ports | tr ' ' ','))"
    for p in "${all[@]}"; do
        redis_answers "$p" && answering+=("$p")
        our_pid "$(sentinel_pidfile "$p")" redis-server >/dev/null && ours+=("$p")
    done
    if ((${#answering[@]} == 5)); then
        deadline=$((SECONDS + TIMEOUT))
        until sentinel_healthy; do
            ((SECONDS < deadline)) ||
                die "redis-sentinel: $range all answer, but the Sentinels do not agree on master" \
                    "'$SENTINEL_MASTER' with a replica within ${TIMEOUT}s; not touching them." \
                    "If they are ours, run 'scripts/services down redis-sentinel' and try again"
            sleep 0.5
        done
        if ((${#ours[@]} == 5)); then
            log "redis-sentinel: already running on $range (started by us)"
        else
            log "redis-sentinel: reusing the group already answering on $range"
        fi
        return 0
    fi
    if ((${#answering[@]})); then
        die "redis-sentinel: only some of $range answer (${answering[*]}); not touching them." \
            "If they are ours, run 'scripts/services down redis-sentinel'; otherwise set" \
            "DLOCK_REDIS_SENTINEL_PORT and DLOCK_REDIS_SENTINEL_DATA_PORT to free ports"
    fi
    for p in "${all[@]}"; do
        if tcp_open "$p"; then
            die "redis-sentinel: port $HOST:$p is in use by something that is not Redis"
        fi
    done
    command -v redis-server >/dev/null 2>&1 || die "redis-sentinel: redis-server is not installed"
    command -v redis-cli >/dev/null 2>&1 || die "redis-sentinel: redis-cli is not installed"

    local master=$REDIS_SENTINEL_DATA_PORT
    sentinel_start_data "$master"
    sentinel_start_data "$((master + 1))" "$master"
    for p in $(sentinel_ports); do
        sentinel_start_sentinel "$p" "$master"
    done
    deadline=$((SECONDS + TIMEOUT))
    until sentinel_healthy; do
        ((SECONDS < deadline)) ||
            sentinel_abort "$(sentinel_dir "$REDIS_SENTINEL_PORT")/redis.log" \
                "redis-sentinel: the Sentinels did not agree on a master with its replica within ${TIMEOUT}s"
        sleep 0.5
    done
    local pids=()
    for p in "${all[@]}"; do
        pids+=("$p:$(our_pid "$(sentinel_pidfile "$p")" redis-server || echo '?')")
    done
    log "redis-sentinel: up on $range (master on $master; pids ${pids[*]})"
}

# Stop the servers and Sentinels of the group that this script started.
sentinel_down() {
    local p pid
    for p in $(sentinel_data_ports) $(sentinel_ports); do
        if pid=$(our_pid "$(sentinel_pidfile "$p")" redis-server); then
            stop_pid "redis-sentinel:$p" "$pid" redis-server
            rm -f "$(sentinel_pidfile "$p")"
            log "redis-sentinel: stopped the server on $HOST:$p"
        elif tcp_open "$p"; then
            log "redis-sentinel: $HOST:$p is served by a server we did not start; leaving it alone"
        else
            log "redis-sentinel: nothing running on $HOST:$p"
        fi
    done
}

# Status details: which processes of the group are ours, and where the master is.
sentinel_origin() {
    local p pid ours=() foreign=()
    for p in $(sentinel_data_ports) $(sentinel_ports); do
        if pid=$(our_pid "$(sentinel_pidfile "$p")" redis-server); then
            ours+=("$p:$pid")
        elif tcp_open "$p"; then
            foreign+=("$p")
        fi
    done
    if ((${#ours[@]} == 5)); then
        printf 'started-by-us (pids %s, master on %s, state %s/redis-sentinel)' \
            "${ours[*]}" "$(sentinel_master_port "$REDIS_SENTINEL_PORT")" "$STATE_DIR"
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == 5)); then
        printf 'reused (not started by scripts/services)'
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == 0)); then
        printf -- '-'
    else
        printf 'ours: %s; others listening: %s' "${ours[*]:--}" "${foreign[*]:--}"
    fi
}


# Stop the cluster nodes this script started; leave any other server alone.
cluster_down() {
    local p pidfile pid
    for p in $(cluster_ports); do
        pidfile=$(cluster_node_dir "$p")/redis.pid
        if pid=$(our_pid "$pidfile" redis-server); then
            stop_pid "redis-cluster:$p" "$pid" redis-server
            rm -f "$pidfile"
            log "redis-cluster: stopped the node on $HOST:$p"
        elif tcp_open "$p"; then
            log "redis-cluster: $HOST:$p is served by a server we did not start; leaving it alone"
        else
            log "redis-cluster: nothing running on $HOST:$p"
        fi
    done
}

# Status line details for the cluster ($1: up/down): which nodes are ours.
cluster_origin() {
    local state=$1 p pid ours=() foreign=()
    for p in $(cluster_ports); do
        if pid=$(our_pid "$(cluster_node_dir "$p")/redis.pid" redis-server); then
            ours+=("$p:$pid")
        elif tcp_open "$p"; then
            foreign+=("$p")
        fi
    done
    if ((${#ours[@]} == 3)); then
        printf 'started-by-us (pids %s, state %s/redis-cluster)' "${ours[*]}" "$STATE_DIR"
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == 3)) && [[ $state == up ]]; then
        printf 'reused (not started by scripts/services)'
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == 3)); then
        printf 'listening, but not a healthy 3-master cluster (not started by scripts/services)'
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == 0)); then
        printf -- '-'
    else
        printf 'ours: %s; others listening: %s' "${ours[*]:--}" "${foreign[*]:--}"
    fi
}
