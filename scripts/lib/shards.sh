# Runs the workspace's test binaries in shards, several at once. Sourced by scripts/test and
# scripts/stress, not run on its own.
#
# A shard is a list of tests of one binary, run by that binary directly from its package's
# directory, as cargo would. Most of a test's time is spent waiting on leases and servers, so
# several shards at once finish in a fraction of the time of `cargo test`, one binary after the
# other. One rule keeps them apart: two binaries of one package never run at once, because some
# tests drive faults into the servers their package's other binaries use (etcd.rs kills a
# cluster member, ensemble.rs ZooKeeper servers), which `cargo test` never runs beside them.
# Shards of one binary do run at once (as more test threads would). Doc tests are not in any
# shard: `cargo test --doc` runs them.
#
# Every shard runs as a background job in a process group of its own (one job control makes,
# under `set -m`, or else setsid), its pid in `shard_pids`; `shards_stop` stops them all.

shard_pids=()

# Builds the test binaries and writes "package-directory executable" for each.
shards_binaries() {
    cargo test --workspace --all-features --no-run -q --message-format=json |
        jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test)
               | "\(.manifest_path | sub("/Cargo.toml$"; "")) \(.executable)"'
}

# Builds the test binaries and splits every binary's tests (those whose name contains $3, all
# when empty) into shard files of at most $2 tests in directory $1: the package directory, the
# executable, then one test name per line. Prints how many shards it wrote.
shards_make() {
    local out=$1 size=$2 filter=$3 dir exe count=0 i tests binaries listed
    mkdir -p "$out"
    # Each output captured first and its status checked: this runs in a command substitution,
    # where `set -e` does not apply, and a build that failed must not read as no test at all.
    binaries=$(shards_binaries) || return
    while read -r dir exe; do
        [[ -n $exe ]] || continue
        listed=$("$exe" --list --format terse) || {
            printf 'shards: %s --list failed\n' "$exe" >&2
            return 1
        }
        mapfile -t tests < <(sed -n 's/: test$//p' <<<"$listed" | { grep -F -- "$filter" || true; })
        for ((i = 0; i < ${#tests[@]}; i += size)); do
            count=$((count + 1))
            {
                printf '%s\n%s\n' "$dir" "$exe"
                printf '%s\n' "${tests[@]:i:size}"
            } >"$out/$(printf '%03d' "$count")"
        done
    done <<<"$binaries"
    printf '%d\n' "$count"
}

# Runs shard file $1, its output in $2.
shards_run_one() {
    local dir exe lines
    mapfile -t lines <"$1"
    dir=${lines[0]}
    exe=${lines[1]}
    cd "$dir"
    if [[ $- == *m* ]]; then
        CARGO_MANIFEST_DIR=$dir exec "$exe" --exact "${lines[@]:2}" >"$2" 2>&1
    fi
    # Without job control the shard is in the caller's process group: setsid gives it its own,
    # without a fork (this subshell leads no group), so its pid stays the one `$!` gave.
    CARGO_MANIFEST_DIR=$dir exec setsid "$exe" --exact "${lines[@]:2}" >"$2" 2>&1
}

# Runs every shard of directory $1 once, at most $3 at once, each shard's output in directory
# $2 (as <shard>.log).
shards_run_all() {
    local shards_dir=$1 logs=$2 jobs=$3 next i pid other ok shard
    local pending=("$shards_dir"/*)
    local -A running=() package=() binary=()
    mkdir -p "$logs"
    for shard in "${pending[@]}"; do
        package[$shard]=$(sed -n 1p "$shard")
        binary[$shard]=$(sed -n 2p "$shard")
    done
    while ((${#pending[@]} > 0 || ${#running[@]} > 0)); do
        while ((${#running[@]} < jobs)); do
            next=
            for i in "${!pending[@]}"; do
                # May start beside the running shards: none of them is another binary of its
                # package.
                ok=1
                for other in "${running[@]}"; do
                    if [[ ${package[$other]} == "${package[${pending[$i]}]}" &&
                        ${binary[$other]} != "${binary[${pending[$i]}]}" ]]; then
                        ok=0
                        break
                    fi
                done
                if ((ok)); then
                    next=$i
                    break
                fi
            done
            [[ -n $next ]] || break
            shards_run_one "${pending[$next]}" "$logs/$(basename "${pending[$next]}").log" &
            running[$!]=${pending[$next]}
            shard_pids+=($!)
            unset "pending[$next]"
            pending=("${pending[@]}")
        done
        pid=
        wait -n -p pid "${!running[@]}" || true
        [[ -z $pid ]] || unset "running[$pid]"
    done
    shard_pids=()
}

# Stops the shards still running (each is a process group).
shards_stop() {
    local pid
    for pid in "${shard_pids[@]}"; do
        kill -- "-$pid" 2>/dev/null || true
    done
    shard_pids=()
}

# Prints "run $1 | binary | case | message" for each failed test in a shard's log ($2) of
# shard file $3, and a line for a shard that printed no result (it crashed or hung).
shards_failures() {
    local run=$1 log=$2 binary package
    package=$(sed -n 1p "$3")
    binary=$(sed -n 2p "$3")
    binary=${binary##*/}
    binary=${package##*/}/${binary%-*}
    awk -v run="$run" -v binary="$binary" '
        /^---- .* stdout ----$/ { case_ = $2; want = 0; next }
        /panicked at/ && case_ != "" { want = 1; next }
        want == 1 { printf "run %s | %s | %s | %s\n", run, binary, case_, $0; want = 0; case_ = "" }
    ' "$log"
    if ! grep -q '^test result' "$log"; then
        printf 'run %s | %s | (the shard) | no test result: it crashed or was stopped (log %s)\n' \
            "$run" "$binary" "$log"
    fi
}
