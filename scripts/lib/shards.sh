# Runs the workspace's test binaries in shards, several at once. Sourced by scripts/test and
# scripts/stress, not run on its own.
#
# A shard is a list of tests of one binary, run by that binary directly from its package's
# directory (with the CARGO_MANIFEST_DIR cargo sets; the tests read no other variable cargo
# sets at run time). Most of a test's time is spent waiting on leases and servers, so several
# shards at once finish in a fraction of the time of `cargo test`, one binary after the other.
# One rule keeps them apart: two binaries of one package never run at once, because some tests
# drive faults into the servers their package's other binaries use (etcd.rs kills a cluster
# member, ensemble.rs ZooKeeper servers), which `cargo test` never runs beside them.
# Shards of one binary do run at once, in separate processes: a lock in a `static` does not
# serialize tests across shards. The binaries whose tests take turns that way (dlock-sql's
# sql.rs, dlock-etcd's etcd.rs, dlock-zookeeper's ensemble.rs) have far fewer tests than a
# shard holds, so each is one shard; `shards_make` fails if one ever outgrows it.
# Doc tests are not in any shard: `cargo test --doc` runs them.
#
# Every shard runs as a background job in a process group of its own, its pid in `shard_pids`;
# `shards_stop` stops them all. This needs job control: `shards_run_all` turns it on while it
# runs (it also keeps a finished job's status until `wait -n` asks for it; without it, bash
# forgets a job that ends while another is being reaped). A shard's output goes to
# <logs>/<shard>.log and its exit status to <logs>/<shard>.status.

if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
    printf 'shards: bash 5.1 or later is needed (wait -n -p); this is %s\n' "$BASH_VERSION" >&2
    exit 1
fi

shard_pids=()
declare -A shard_logs=()

# The binaries whose tests serialize themselves with a lock in a `static`: never split.
shards_unsplittable='/(sql|etcd|ensemble)-[0-9a-f]+$'
# The tests that spend half a minute waiting out a default lease and do next to nothing
# else (the conformance case that cuts a holder off with the default settings, once per
# store, and the sabotaged stores it must catch): each binary's go in shards of their own, named NNN-idle, whose tests all run at
# once (at most shards_idle_threads, whatever RUST_TEST_THREADS says), rather than holding
# up one of two test threads of a busy shard each. The most at once is the SQL binary's:
# its idle shard's 8 beside two tests of a busy shard.
shards_idle='(^|::)a_silent_holder_stops_before_the_lock_passes_on$|^a_store_that_frees_(slightly_)?early_is_caught$'
shards_idle_threads=8

# Builds the test binaries and writes "package-directory executable" for each. The compiler's
# messages are rendered on stderr, as a plain build shows them.
shards_binaries() {
    cargo test --workspace --all-features --no-run -q --message-format=json-render-diagnostics |
        jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test)
               | "\(.manifest_path | sub("/Cargo.toml$"; "")) \(.executable)"'
}

# Builds the test binaries and splits every binary's tests (those whose name contains $3, all
# when empty) into shard files of at most $2 tests in directory $1: the package directory, the
# executable, then one test name per line; the idle tests (above) in files of their own.
# Prints how many shards it wrote.
shards_make() {
    local out=$1 size=$2 filter=$3 dir exe count=0 i tests idle binaries listed
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
        if [[ ! $exe =~ $shards_unsplittable ]]; then
            mapfile -t idle < <(printf '%s\n' "${tests[@]}" | { grep -E -- "$shards_idle" || true; })
            for ((i = 0; i < ${#idle[@]}; i += size)); do
                count=$((count + 1))
                printf '%s\n' "$dir" "$exe" "${idle[@]:i:size}" >"$out/$(printf '%03d' "$count")-idle"
            done
            if ((${#idle[@]} > 0)); then
                mapfile -t tests < <(printf '%s\n' "${tests[@]}" | { grep -vE -- "$shards_idle" || true; })
            fi
        fi
        if ((${#tests[@]} > size)) && [[ $exe =~ $shards_unsplittable ]]; then
            printf 'shards: %s has %d tests, more than one shard (%d): its tests take turns through a static lock, which separate processes do not share\n' \
                "$exe" "${#tests[@]}" "$size" >&2
            return 1
        fi
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
    if [[ $1 == *-idle ]]; then
        local threads=$((${#lines[@]} - 2))
        RUST_TEST_THREADS=$((threads < shards_idle_threads ? threads : shards_idle_threads))
        export RUST_TEST_THREADS
    fi
    cd "$dir"
    CARGO_MANIFEST_DIR=$dir exec "$exe" --exact "${lines[@]:2}" >"$2" 2>&1
}

# A shard's name (its file's) and binary, for messages: "007 dlock-sql/conformance".
shards_describe() {
    local exe package
    package=$(sed -n 1p "$1")
    exe=$(sed -n 2p "$1")
    exe=${exe##*/}
    printf '%s %s/%s' "${1##*/}" "${package##*/}" "${exe%-*}"
}

# Runs every shard of directory $1 once, at most $3 at once, each shard's output in directory
# $2. With $4 = verbose, says on stderr when each shard starts and how it ended.
shards_run_all() {
    local shards_dir=$1 logs=$2 jobs=$3 verbose=${4:-} next i pid other ok shard status
    local pending=("$shards_dir"/*)
    local -A running=() package=() binary=() began=()
    local monitor=${-//[^m]/}
    set -m
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
            shard=${pending[$next]}
            shards_run_one "$shard" "$logs/${shard##*/}.log" &
            running[$!]=$shard
            began[$!]=$SECONDS
            shard_pids+=($!)
            shard_logs[$!]=$logs/${shard##*/}.log
            [[ $verbose != verbose ]] ||
                printf 'shards: started %s\n' "$(shards_describe "$shard")" >&2
            unset "pending[$next]"
            pending=("${pending[@]}")
        done
        pid=
        if wait -n -p pid "${!running[@]}"; then status=0; else status=$?; fi
        if [[ -z $pid ]]; then
            printf 'shards: wait failed (status %d) with shards still running\n' "$status" >&2
            return 1
        fi
        shard=${running[$pid]}
        printf '%d\n' "$status" >"$logs/${shard##*/}.status"
        # What the shard left running (a process it started and did not stop) goes with it.
        kill -- "-$pid" 2>/dev/null || true
        if [[ $verbose == verbose ]]; then
            printf 'shards: ended %s after %d s: %s\n' "$(shards_describe "$shard")" \
                $((SECONDS - ${began[$pid]})) "$(shards_outcome "$shard" "$logs")" >&2
        fi
        unset "running[$pid]" "shard_logs[$pid]"
    done
    shard_pids=()
    [[ -n $monitor ]] || set +m
}

# How shard $1 ended, from its log and status in directory $2: "passed: N passed, M ignored"
# when it exited 0 and ran every test it names, else what went wrong.
shards_outcome() {
    local shard=$1 logs=$2 status result passed ignored names
    status=$(cat "$logs/${shard##*/}.status" 2>/dev/null || printf 'none')
    result=$(grep -m1 '^test result: ' "$logs/${shard##*/}.log" || true)
    names=$(($(wc -l <"$shard") - 2))
    if [[ $status != 0 ]]; then
        if [[ $status =~ ^[0-9]+$ ]] && ((status > 128)); then
            printf 'failed: killed by signal %d; %s\n' $((status - 128)) "${result:-no test result}"
        else
            printf 'failed: exit status %s; %s\n' "$status" "${result:-no test result}"
        fi
        return
    fi
    passed=$(sed -n 's/^test result: ok\. \([0-9][0-9]*\) passed;.* \([0-9][0-9]*\) ignored;.*/\1/p' <<<"$result")
    ignored=$(sed -n 's/^test result: ok\. \([0-9][0-9]*\) passed;.* \([0-9][0-9]*\) ignored;.*/\2/p' <<<"$result")
    if [[ -z $passed ]]; then
        printf 'failed: exit status 0 but no test result\n'
    elif ((passed + ignored != names)); then
        printf 'failed: %d passed and %d ignored of the %d tests it names\n' "$passed" "$ignored" "$names"
    else
        printf 'passed: %d passed, %d ignored\n' "$passed" "$ignored"
    fi
}

# Stops the shards still running (each is a process group), and shows the end of each one's
# output: what a stopped run would otherwise lose.
shards_stop() {
    local pid
    for pid in "${shard_pids[@]}"; do
        kill -- "-$pid" 2>/dev/null || true
        if [[ -n ${shard_logs[$pid]:-} && -s ${shard_logs[$pid]} ]]; then
            printf '\n---- shards: stopped the shard logging to %s; its last lines:\n' "${shard_logs[$pid]}" >&2
            tail -n 20 "${shard_logs[$pid]}" >&2
        fi
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
