# shellcheck shell=bash
# etcd: one member, a cluster of three.
# Sourced by scripts/services, whose globals (ports, users, STATE_DIR) and helpers
# (scripts/lib/services/common.sh) it uses; not run on its own.

# ---------------------------------------------------------------------------
# etcd: one member (etcd) and a 3-member cluster (etcd-cluster)
# ---------------------------------------------------------------------------

etcd_member_dir() { printf '%s/etcd/%s' "$STATE_DIR" "$1"; }

# 0: the member whose client port is $1 reports itself healthy.
etcd_healthy() {
    timeout 5 etcdctl --endpoints="$HOST:$1" --command-timeout=3s endpoint health >/dev/null 2>&1
}

etcd_cluster_ports() {
    printf '%s %s %s' "$ETCD_CLUSTER_PORT" "$((ETCD_CLUSTER_PORT + 1))" "$((ETCD_CLUSTER_PORT + 2))"
}

# Start the member with client port $1, peer port $2, named $3, in the cluster
# $4 ("name=http://host:peer,..."), in the background.  A member that has data
# already rejoins with it.  The members of one cluster share its token ($5).
etcd_start_member() {
    local port=$1 peer=$2 name=$3 cluster=$4 token=$5 dir state=new pid
    dir=$(etcd_member_dir "$port")
    mkdir -p "$dir"
    [[ -d $dir/data/member ]] && state=existing
    log "etcd: starting member $name on $HOST:$port (peer $peer, data $dir/data, log $dir/etcd.log)"
    local launcher=()
    command -v setsid >/dev/null 2>&1 && launcher=(setsid)
    "${launcher[@]}" nohup etcd --name "$name" --data-dir "$dir/data" \
        --listen-client-urls "http://$HOST:$port" --advertise-client-urls "http://$HOST:$port" \
        --listen-peer-urls "http://$HOST:$peer" --initial-advertise-peer-urls "http://$HOST:$peer" \
        --initial-cluster "$cluster" --initial-cluster-state "$state" \
        --initial-cluster-token "$token" \
        </dev/null >>"$dir/etcd.log" 2>&1 &
    pid=$!
    wait_for_exec "$pid" "$dir/data"
    printf '%s\n' "$pid" >"$dir/etcd.pid"
}

# Wait until the members on the client ports given are healthy; fail early if
# one of ours died.
etcd_wait() {
    local what=$1 p dir deadline=$((SECONDS + TIMEOUT)) ok
    shift
    while :; do
        ok=1
        for p in "$@"; do
            etcd_healthy "$p" || ok=0
        done
        ((ok)) && return 0
        for p in "$@"; do
            dir=$(etcd_member_dir "$p")
            if [[ -f $dir/etcd.pid ]] && ! our_pid "$dir/etcd.pid" "$dir/data" >/dev/null; then
                die_log "$dir/etcd.log" "$what: the member on $HOST:$p exited"
            fi
        done
        ((SECONDS < deadline)) || die_log "$(etcd_member_dir "$1")/etcd.log" \
            "$what: $HOST:$* not healthy within ${TIMEOUT}s"
        sleep 0.5
    done
}

etcd_up() {
    local dir
    dir=$(etcd_member_dir "$ETCD_PORT")
    if our_pid "$dir/etcd.pid" "$dir/data" >/dev/null; then
        log "etcd: already running on $HOST:$ETCD_PORT (started by us)"
    elif etcd_healthy "$ETCD_PORT"; then
        log "etcd: reusing the member already answering on $HOST:$ETCD_PORT"
        return 0
    elif tcp_open "$ETCD_PORT" || tcp_open "$((ETCD_PORT + 1))"; then
        die "etcd: something that is not a healthy etcd listens on $HOST:$ETCD_PORT or $((ETCD_PORT + 1));" \
            "not touching it. Stop it or set DLOCK_ETCD_PORT to another port"
    else
        etcd_start_member "$ETCD_PORT" "$((ETCD_PORT + 1))" dlock \
            "dlock=http://$HOST:$((ETCD_PORT + 1))" "dlock-$ETCD_PORT"
    fi
    etcd_wait etcd "$ETCD_PORT"
    log "etcd: up on $HOST:$ETCD_PORT (pid $(our_pid "$dir/etcd.pid" "$dir/data"))"
}

etcd_cluster_up() {
    local ports p i=1 dir cluster="" ours=0 answering=0
    read -r -a ports <<<"$(etcd_cluster_ports)"
    for p in "${ports[@]}"; do
        cluster+="${cluster:+,}m$i=http://$HOST:$((p + 100))"
        i=$((i + 1))
        dir=$(etcd_member_dir "$p")
        if our_pid "$dir/etcd.pid" "$dir/data" >/dev/null; then
            ours=$((ours + 1))
        elif etcd_healthy "$p"; then
            answering=$((answering + 1))
        elif tcp_open "$p"; then
            die "etcd-cluster: something that is not a healthy etcd listens on $HOST:$p; not touching it." \
                "Stop it or set DLOCK_ETCD_CLUSTER_PORT to another base port"
        fi
    done
    if ((answering == 3)); then
        log "etcd-cluster: reusing the members already answering on $HOST:${ports[0]}-${ports[2]}"
        return 0
    fi
    ((answering == 0)) || die "etcd-cluster: members we did not start answer on some of" \
        "$HOST:${ports[0]}-${ports[2]}; not touching them. Set DLOCK_ETCD_CLUSTER_PORT to another base port"
    i=1
    for p in "${ports[@]}"; do
        dir=$(etcd_member_dir "$p")
        if ! our_pid "$dir/etcd.pid" "$dir/data" >/dev/null; then
            # A fresh cluster starts from empty data; a member restarted next to
            # running ones rejoins with its own.
            ((ours)) || rm -rf "$dir/data"
            etcd_start_member "$p" "$((p + 100))" "m$i" "$cluster" "dlock-cluster-${ports[0]}"
        fi
        i=$((i + 1))
    done
    etcd_wait etcd-cluster "${ports[@]}"
    log "etcd-cluster: up on $HOST:${ports[0]}-${ports[2]}"
}

# Stop the members this script started on the client ports given.
etcd_down() {
    local what=$1 p dir pid
    shift
    for p in "$@"; do
        dir=$(etcd_member_dir "$p")
        if pid=$(our_pid "$dir/etcd.pid" "$dir/data"); then
            stop_pid "$what:$p" "$pid" "$dir/data"
            rm -f "$dir/etcd.pid"
            log "$what: stopped the member on $HOST:$p"
        elif tcp_open "$p"; then
            log "$what: $HOST:$p is served by a member we did not start; leaving it alone"
        else
            log "$what: nothing running on $HOST:$p"
        fi
    done
}

# The client port of the cluster's leader (empty if no member says it leads): a member's
# `endpoint status` (JSON) gives its own id (header.member_id) and the leader's id (leader).
# The ids are 64-bit numbers, compared as text (jq 1.6 would round them to doubles).
etcd_cluster_leader() {
    local p status id leader
    for p in $(etcd_cluster_ports); do
        status=$(timeout 5 etcdctl --endpoints="$HOST:$p" --command-timeout=3s \
            endpoint status -w json 2>/dev/null) || continue
        id=$(grep -o '"member_id":[0-9]*' <<<"$status" | head -n 1 | cut -d: -f2)
        leader=$(grep -o '"leader":[0-9]*' <<<"$status" | head -n 1 | cut -d: -f2)
        if [[ -n $id && $id == "$leader" ]]; then
            printf '%s' "$p"
            return 0
        fi
    done
}

# A server fault: SIGKILL the single member, start it again on its data, wait until healthy.
etcd_crash() {
    local dir pid
    dir=$(etcd_member_dir "$ETCD_PORT")
    pid=$(our_pid "$dir/etcd.pid" "$dir/data") ||
        die "etcd: no member started by this script on $HOST:$ETCD_PORT; crash only stops its own"
    kill_ours etcd "$pid" "$dir/data"
    cmd_up etcd
}

# A server fault: SIGKILL the cluster's leader, start it again on its data (it rejoins as a
# follower once the other two have elected a leader), and wait until all three members are
# healthy and one leads.
etcd_cluster_crash() {
    local p dir pid leader deadline
    for p in $(etcd_cluster_ports); do
        dir=$(etcd_member_dir "$p")
        our_pid "$dir/etcd.pid" "$dir/data" >/dev/null ||
            die "etcd-cluster: the member on $HOST:$p was not started by this script; crash only stops its own"
    done
    leader=$(etcd_cluster_leader)
    [[ -n $leader ]] || die "etcd-cluster: no leader among $HOST:$(etcd_cluster_ports | tr ' ' ',')"
    dir=$(etcd_member_dir "$leader")
    pid=$(our_pid "$dir/etcd.pid" "$dir/data") ||
        die "etcd-cluster: the leader on $HOST:$leader was not started by this script"
    log "etcd-cluster: crashing the leader on $HOST:$leader"
    kill_ours "etcd-cluster:$leader" "$pid" "$dir/data"
    cmd_up etcd-cluster
    deadline=$((SECONDS + TIMEOUT))
    until leader=$(etcd_cluster_leader) && [[ -n $leader ]]; do
        ((SECONDS < deadline)) || die "etcd-cluster: no leader ${TIMEOUT}s after the restart"
        sleep 0.2
    done
    log "etcd-cluster: the leader is now on $HOST:$leader"
}

# Status details: which members are ours.
etcd_origin() {
    local p pid ours=() foreign=()
    for p in "$@"; do
        if pid=$(our_pid "$(etcd_member_dir "$p")/etcd.pid" "$(etcd_member_dir "$p")/data"); then
            ours+=("$p:$pid")
        elif tcp_open "$p"; then
            foreign+=("$p")
        fi
    done
    if ((${#ours[@]} == $#)); then
        printf 'started-by-us (pids %s, state %s/etcd)' "${ours[*]}" "$STATE_DIR"
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == $#)); then
        printf 'reused (not started by scripts/services)'
    elif ((${#ours[@]} == 0 && ${#foreign[@]} == 0)); then
        printf -- '-'
    else
        printf 'ours: %s; others listening: %s' "${ours[*]:--}" "${foreign[*]:--}"
    fi
}
