# shellcheck shell=bash
# ZooKeeper: one server, an ensemble of three.
# Sourced by scripts/services, whose globals (ports, users, STATE_DIR) and helpers
# (scripts/lib/services/common.sh) it uses; not run on its own.

# ---------------------------------------------------------------------------
# ZooKeeper
# ---------------------------------------------------------------------------

# Classpath for the Debian-packaged ZooKeeper.  zookeeper.jar's manifest lists
# its dependencies (netty, jetty, jackson, slf4j-api, ...); we add zookeeper-jute
# and, when present, an slf4j -> log4j 1.2 binding so the server logs to
# stdout (our log file) via the log4j.properties written next to zoo.cfg.
zk_classpath() {
    local confdir=$1 cp jar
    cp=$confdir:/usr/share/java/zookeeper.jar
    for jar in zookeeper-jute.jar slf4j-log4j12.jar log4j-1.2.jar; do
        [[ -r /usr/share/java/$jar ]] && cp+=:/usr/share/java/$jar
    done
    printf '%s' "$cp"
}

zk_up() {
    local name pidfile logfile confdir datadir cfg pid java_opts
    name=$(instance_name zookeeper)
    pidfile=$(service_pidfile zookeeper)
    logfile=$(service_logfile zookeeper)
    confdir=$STATE_DIR/$name
    datadir=$confdir/data
    cfg=$confdir/zoo.cfg

    if zk_answers "$ZK_PORT"; then
        if pid=$(our_pid "$pidfile" "$cfg"); then
            log "zookeeper: already running on $HOST:$ZK_PORT (started by us, pid $pid)"
        else
            log "zookeeper: reusing the server already answering on $HOST:$ZK_PORT"
        fi
        zk_check_tick "$ZK_PORT"
        return 0
    fi
    if pid=$(our_pid "$pidfile" "$cfg"); then
        # Ours, but not answering (yet): wait for it rather than start another.
        log "zookeeper: our server (pid $pid) is not answering yet; waiting"
        wait_until_answers zookeeper "$pidfile" "$logfile"
        return 0
    fi
    if tcp_open "$ZK_PORT"; then
        die "zookeeper: port $HOST:$ZK_PORT is in use by something that is not ZooKeeper"
    fi
    zk_installed || die "zookeeper: /usr/share/java/zookeeper.jar or java is missing (install the 'zookeeper' package)"

    mkdir -p "$datadir"
    cat >"$cfg" <<EOF
# written by scripts/services
# A tick of 1 s: the server expires a session on the first tick after its timeout, so a
# killed client's 2 s session (the torture's) is gone within 3 s, not 4.
tickTime=1000
dataDir=$datadir
clientPort=$ZK_PORT
clientPortAddress=$HOST
maxClientCnxns=0
minSessionTimeout=1000
maxSessionTimeout=60000
4lw.commands.whitelist=*
admin.enableServer=false
EOF
    cat >"$confdir/log4j.properties" <<'EOF'
# written by scripts/services: log to stdout, which goes to the log file
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} - %-5p [%t:%C{1}@%L] - %m%n
EOF
    # Intentionally word-split: a list of JVM options.
    read -r -a java_opts <<<"${DLOCK_ZK_JAVA_OPTS:--Xmx512m}"

    log "zookeeper: starting on $HOST:$ZK_PORT (config $cfg, log $logfile)"
    : >"$logfile"
    local launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    "${launcher[@]}" nohup java "${java_opts[@]}" \
        -Dzookeeper.log.dir="$STATE_DIR" \
        -Dzookeeper.root.logger=INFO,CONSOLE \
        -Dlog4j.configuration="file:$confdir/log4j.properties" \
        -Dzookeeper.4lw.commands.whitelist='*' \
        -Dzookeeper.admin.enableServer=false \
        -Dzookeeper.jmx.log4j.disable=true \
        -cp "$(zk_classpath "$confdir")" \
        org.apache.zookeeper.server.quorum.QuorumPeerMain "$cfg" \
        </dev/null >>"$logfile" 2>&1 &
    pid=$!
    wait_for_exec "$pid" "$cfg"
    printf '%s\n' "$pid" >"$pidfile"
    sleep 0.5
    if ! pid_matches "$pid" "$cfg"; then
        rm -f "$pidfile"
        die_log "$logfile" "zookeeper: java exited immediately"
    fi
    wait_until_answers zookeeper "$pidfile" "$logfile"
    log "zookeeper: up on $HOST:$ZK_PORT (pid $pid)"
}

# ---------------------------------------------------------------------------
# ZooKeeper ensemble (optional: three servers forming one quorum)
# ---------------------------------------------------------------------------

ensemble_ports() {
    printf '%s %s %s' "$ZK_ENSEMBLE_PORT" "$((ZK_ENSEMBLE_PORT + 1))" "$((ZK_ENSEMBLE_PORT + 2))"
}

ensemble_node_dir() {
    printf '%s/zk-ensemble/%s' "$STATE_DIR" "$1"
}

# 0: the server on port $1 answers `ruok` with `imok`.
zk_ruok() {
    local reply
    reply=$(tcp_talk "$1" 'ruok')
    [[ $reply == imok* ]]
}

# The `Mode:` a server reports in `srvr` (leader, follower, standalone), or
# nothing while it is not serving (e.g. during an election).
zk_mode() {
    tcp_talk "$1" 'srvr' | sed -n 's/^Mode: *//p' | tr -d '\r' | head -n 1
}

# 0: all three servers answer ruok.
ensemble_answers() {
    local p
    for p in $(ensemble_ports); do
        zk_ruok "$p" || return 1
    done
}

# 0: all three servers serve, as one leader and two followers.
ensemble_healthy() {
    local p mode leaders=0
    for p in $(ensemble_ports); do
        mode=$(zk_mode "$p")
        case $mode in
            leader) leaders=$((leaders + 1)) ;;
            follower) ;;
            *) return 1 ;;
        esac
    done
    ((leaders == 1))
}

# The port whose server is the leader (empty if none).
ensemble_leader() {
    local p
    for p in $(ensemble_ports); do
        if [[ $(zk_mode "$p") == leader ]]; then
            printf '%s' "$p"
            return 0
        fi
    done
}

# Status details: which servers are ours.
ensemble_origin() {
    local p pid ours=() foreign=()
    for p in $(ensemble_ports); do
        if pid=$(our_pid "$(ensemble_node_dir "$p")/zk.pid" "$(ensemble_node_dir "$p")/zoo.cfg"); then
            ours+=("$p:$pid")
        elif tcp_open "$p"; then
            foreign+=("$p")
        fi
    done
    if ((${#ours[@]} == 3)); then
        printf 'started-by-us (pids %s, leader %s, state %s/zk-ensemble)' \
            "${ours[*]}" "$(ensemble_leader)" "$STATE_DIR"
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == 3)); then
        printf 'reused (not started by scripts/services)'
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == 0)); then
        printf -- '-'
    else
        printf 'ours: %s; others listening: %s' "${ours[*]:--}" "${foreign[*]:--}"
    fi
}

# Write the configuration of the server on client port $1 (myid $2).
ensemble_write_config() {
    local port=$1 id=$2 dir i p
    dir=$(ensemble_node_dir "$port")
    mkdir -p "$dir/data"
    printf '%s\n' "$id" >"$dir/data/myid"
    {
        printf '# written by scripts/services (zk-ensemble, server %s)\n' "$id"
        printf 'tickTime=1000\ninitLimit=10\nsyncLimit=5\n'
        printf 'dataDir=%s/data\n' "$dir"
        printf 'clientPort=%s\nclientPortAddress=%s\n' "$port" "$HOST"
        printf 'maxClientCnxns=0\nminSessionTimeout=1000\nmaxSessionTimeout=60000\n'
        printf '4lw.commands.whitelist=*\nadmin.enableServer=false\n'
        i=1
        for p in $(ensemble_ports); do
            printf 'server.%s=%s:%s:%s\n' "$i" "$HOST" "$((p + 610))" "$((p + 1610))"
            i=$((i + 1))
        done
    } >"$dir/zoo.cfg"
    cat >"$dir/log4j.properties" <<'EOF'
# written by scripts/services: log to stdout, which goes to the log file
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} - %-5p [%t:%C{1}@%L] - %m%n
EOF
}

# Start the server on client port $1 in the background (as zk_up does).
ensemble_start_node() {
    local port=$1 dir pid java_opts
    dir=$(ensemble_node_dir "$port")
    # Intentionally word-split: a list of JVM options.
    read -r -a java_opts <<<"${DLOCK_ZK_ENSEMBLE_JAVA_OPTS:--Xmx128m}"
    log "zk-ensemble: starting the server on $HOST:$port (config $dir/zoo.cfg, log $dir/zk.log)"
    : >"$dir/zk.log"
    local launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    "${launcher[@]}" nohup java "${java_opts[@]}" \
        -Dzookeeper.log.dir="$dir" \
        -Dzookeeper.root.logger=INFO,CONSOLE \
        -Dlog4j.configuration="file:$dir/log4j.properties" \
        -Dzookeeper.4lw.commands.whitelist='*' \
        -Dzookeeper.admin.enableServer=false \
        -Dzookeeper.jmx.log4j.disable=true \
        -cp "$(zk_classpath "$dir")" \
        org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" \
        </dev/null >>"$dir/zk.log" 2>&1 &
    pid=$!
    wait_for_exec "$pid" "$dir/zoo.cfg"
    printf '%s\n' "$pid" >"$dir/zk.pid"
}

ensemble_up() {
    local ports p dir i answering=() busy=() ours=() missing=()
    read -r -a ports <<<"$(ensemble_ports)"
    local range="$HOST:${ports[0]}-${ports[2]}"

    for p in "${ports[@]}"; do
        dir=$(ensemble_node_dir "$p")
        if our_pid "$dir/zk.pid" "$dir/zoo.cfg" >/dev/null; then
            ours+=("$p")
        elif zk_ruok "$p"; then
            answering+=("$p")
        elif tcp_open "$p"; then
            busy+=("$p")
        else
            missing+=("$p")
        fi
    done
    if ((${#busy[@]})); then
        die "zk-ensemble: something that is not ZooKeeper listens on $HOST:${busy[*]}; not touching it." \
            "Stop it or set DLOCK_ZK_ENSEMBLE_PORT to another base port"
    fi
    if ((${#answering[@]} == 3)); then
        log "zk-ensemble: reusing the servers already answering on $range"
    elif ((${#answering[@]})); then
        die "zk-ensemble: ZooKeeper servers we did not start answer on $HOST:${answering[*]}," \
            "but not on all of $range; not touching them. Stop them or set DLOCK_ZK_ENSEMBLE_PORT" \
            "to another base port"
    elif ((${#missing[@]} == 0)); then
        log "zk-ensemble: already running on $range (started by us)"
    else
        zk_installed || die "zk-ensemble: /usr/share/java/zookeeper.jar or java is missing (install the 'zookeeper' package)"
        # A fresh ensemble starts from empty data; a server restarted next to
        # running ones keeps its data and catches up from the leader.
        i=1
        for p in "${ports[@]}"; do
            if [[ " ${missing[*]} " == *" $p "* ]]; then
                ((${#ours[@]})) || rm -rf "$(ensemble_node_dir "$p")/data"
                ensemble_write_config "$p" "$i"
                ensemble_start_node "$p"
            fi
            i=$((i + 1))
        done
    fi

    # Wait for one leader and two followers; fail early if a server of ours died.
    local deadline=$((SECONDS + TIMEOUT)) pids=()
    until ensemble_answers && ensemble_healthy; do
        for p in "${ports[@]}"; do
            dir=$(ensemble_node_dir "$p")
            if [[ " ${ours[*]} ${missing[*]} " == *" $p "* ]] &&
                ! our_pid "$dir/zk.pid" "$dir/zoo.cfg" >/dev/null; then
                die_log "$dir/zk.log" "zk-ensemble: the server on $HOST:$p exited"
            fi
        done
        if ((SECONDS >= deadline)); then
            for p in "${ports[@]}"; do
                log "zk-ensemble: $HOST:$p mode: $(zk_mode "$p" || true)"
            done
            die_log "$(ensemble_node_dir "${ports[0]}")/zk.log" \
                "zk-ensemble: $range did not elect a leader with two followers within ${TIMEOUT}s"
        fi
        sleep 0.5
    done
    for p in "${ports[@]}"; do
        dir=$(ensemble_node_dir "$p")
        pids+=("$p:$(our_pid "$dir/zk.pid" "$dir/zoo.cfg" || printf 'reused')")
    done
    log "zk-ensemble: up on $range (leader on port $(ensemble_leader), pids ${pids[*]})"
}

# Stop the servers this script started; leave any other server alone.
ensemble_down() {
    local p dir pid
    for p in $(ensemble_ports); do
        dir=$(ensemble_node_dir "$p")
        if pid=$(our_pid "$dir/zk.pid" "$dir/zoo.cfg"); then
            stop_pid "zk-ensemble:$p" "$pid" "$dir/zoo.cfg"
            rm -f "$dir/zk.pid"
            log "zk-ensemble: stopped the server on $HOST:$p"
        elif tcp_open "$p"; then
            log "zk-ensemble: $HOST:$p is served by a server we did not start; leaving it alone"
        else
            log "zk-ensemble: nothing running on $HOST:$p"
        fi
    done
}
