# shellcheck shell=bash disable=SC2016 # markdown backquotes in single-quoted text
# Renders docs/reliability.md from the JSON files of scripts/reliability (sourced by it).
#
#   reliability_render DIR PAGE    write PAGE from DIR/*.json (needs jq)
#
# Each file is one run: { row, mode, store, order, seed, commit, date, command, minutes, exit,
# report, error? } with report the object of `dlock torture --json` (or null); DIR/notes.json,
# if there is one, says per "ROW-MODE" why a row failed and what follows from it.

# The tables, from the runs on stdin (a JSON array), for the page's source $1.
reliability_tables_jq='
def cell: tostring | gsub("\\|"; "\\|") | gsub("\n"; " ");
def ms: if . == null then "-" else "\(.) ms" end;
def failed: .exit != 0 or .report == null or ((.report.violations // []) | length) > 0;
def verdict:
  if .report == null then "**run failed** (exit \(.exit), no report)"
  elif ((.report.violations | length) > 0) then "**FAIL** (\(.report.violations | length) violations)"
  elif .exit != 0 then "**run failed** (exit \(.exit))"
  else "pass" end;
def liveness:
  [.report.violations[] | select(startswith("stuck") or startswith("no worker ever acquired"))]
  | if length == 0 then "yes" else "**no** (\(length))" end;
def fairness:
  if (.report.primitives | index("fair")) == null then "n/a"
  else "\(.report.fair_pairs_checked) / \([.report.violations[] | select(contains("overtaken"))] | length)"
  end;
def faults: .report.faults | to_entries | map("\(.key) \(.value)") | join(", ");
def row:
  if .report == null then
    [.store, (.code // .commit)[0:7] + (if .commit | endswith("-dirty") then "-dirty" else "" end),
     .date[0:16] + "Z", .minutes, "-", "-", "-", "-", "-", "-", "-", "-", "-", verdict]
  else
    [.store, (.code // .commit)[0:7] + (if .commit | endswith("-dirty") then "-dirty" else "" end),
     .date[0:16] + "Z", .minutes, .report.holds, faults, .report.fenced_violations,
     "\(.report.overlaps_explained) / \(.report.overlaps_unexplained)", .report.told_late,
     liveness, fairness, (.report.worst_report_delay_ms | ms), (.report.worst_recovery_ms | ms),
     verdict]
  end
  | map(cell) | "| " + join(" | ") + " |";
def title:
  if . == "short" then "Short leases (`--lease 2s`; ZooKeeper sessions and etcd leases of 2 s)"
  elif . == "defaults" then "Defaults (`--defaults`: the library'"'"'s default lease, each store'"'"'s default session)"
  elif . == "drift" then "Clock drift (short leases, the first worker'"'"'s clock at a rate of `--clock-rate`)"
  else . end;
def modeorder: if . == "short" then 0 elif . == "defaults" then 1 elif . == "drift" then 2 else 3 end;

group_by(.mode) | sort_by(.[0].mode | modeorder) | .[] | sort_by(.order, .row) |
"## " + (.[0].mode | title), "",
"| store | code | date | min | holds | faults injected | fenced violations | overlaps explained / unexplained | told late | liveness held | fair pairs / overtaken | worst report delay | worst recovery | verdict |",
"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
(.[] | row), "",
"Commands (from the repository root; passwords as `***`; each also wrote `--json FILE`):", "",
(.[] | "- \(.store), seed \(.seed)" + (if .report.clock_rate then ", clock rate \(.report.clock_rate)" else "" end)
   + ": `\(.command)`"
   + (if failed then
        (if .report == null then "\n  - the run failed, no report; its last words: `\(.error // "" | gsub("\n"; " / ") | gsub("`"; "'"'"'"))`"
         elif (.report.violations | length) > 0 then "\n  - first violation: `\(.report.violations[0] | gsub("`"; "'"'"'"))`"
         else "\n  - exit status \(.exit) without a violation (the run did not finish cleanly)" end)
      else "" end)
   + (if .note then "\n  - why, and what follows: \(.note)" else "" end)),
""
'

reliability_render() {
    local dir=$1 page=$2 runs commits source tmp
    source="${dir%/}/*.json"
    [[ $dir == "$PWD"/* ]] && source=${source#"$PWD"/}
    runs=$(jq -s '[.[] | select(type == "object" and has("row") and has("mode"))]' \
        /dev/null "${dir%/}"/*.json 2>/dev/null || printf '[]')
    # Each run's code: the last commit, up to the one it ran on, that changed what the runs
    # test (the crates, the facade, the lockfile), not the scripts or the docs.
    local c code map='{}'
    for c in $(jq -r '[.[].commit | sub("-dirty$"; "")] | unique | .[]' <<<"$runs"); do
        code=$(git log -1 --format=%H "$c" -- crates src Cargo.toml Cargo.lock 2>/dev/null || true)
        map=$(jq --arg c "$c" --arg code "${code:-$c}" '. + {($c): $code}' <<<"$map")
    done
    runs=$(jq --argjson map "$map" 'map(. + {code: ($map[.commit | sub("-dirty$"; "")] // .commit)})' <<<"$runs")
    # What a failed row means, written by whoever read it: DIR/notes.json, {"ROW-MODE": "text"}.
    local notes='{}'
    [[ -f ${dir%/}/notes.json ]] && notes=$(jq -c . "${dir%/}/notes.json")
    runs=$(jq --argjson notes "$notes" 'map(. + (if $notes[.row + "-" + .mode] then {note: $notes[.row + "-" + .mode]} else {} end))' <<<"$runs")
    commits=$(jq -r '[.[] | .code[0:7] + (if .commit | endswith("-dirty") then "-dirty" else "" end)] | unique | join(", ")' <<<"$runs")
    tmp=$page.tmp
    {
        printf '<!-- generated by scripts/reliability from %s; do not edit -->\n\n' "$source"
        printf '# Reliability: long `dlock torture` runs\n\n'
        printf '> Generated by `scripts/reliability` from `%s`; do not edit. Re-render with\n' "$source"
        printf '> `scripts/reliability --render-only`; rerun rows with `scripts/reliability --rows REGEX`.\n\n'
        if [[ $commits == *,* ]]; then
            printf '> **WARNING: these rows test more than one version of the code (%s). Rows of\n' "$commits"
            printf '> different code: rerun every row (`scripts/reliability`) before comparing them.**\n\n'
        else
            printf '> Every row tests the code of commit %s (the column "code": the last commit that\n' "$commits"
            printf '> changed `crates/`, `src/` or the lockfile; each run'"'"'s JSON keeps the commit it ran on).\n\n'
        fi
        if [[ $commits == *-dirty ]]; then
            printf '> **Note: the runs were of a tree with uncommitted changes (%s).**\n\n' "$commits"
        fi
        cat <<'EOF'
Each row attacks one store with `dlock torture`: worker processes (each with its own
connections) contend for mutexes, fair locks, read-write locks, semaphores and MultiLocks where
the backend has them, and write to a fenced resource that refuses stale tokens and to an
unfenced counter, while the harness injects faults on a schedule drawn from the seed: a holder
SIGSTOPped past its lease (`pause`) or briefly (`blip-pause`), SIGKILLed and replaced (`kill`),
and, through a fault-injecting proxy in front of each worker (network stores, not a Redis
Cluster or a Sentinel group, whose clients learn addresses from the servers), two-way and
one-way partitions, short partitions (`blip-partition`), a silent network, latency, delayed
replies and connection resets. `restart` is a server fault: `scripts/services crash SERVICE`
SIGKILLs the server (for an ensemble or cluster its leader; for the Redis Cluster the master of
slot 0, restarted in place, there being no replica) and starts it again, and `scripts/services
failover redis-sentinel` makes the Sentinels promote the replica. The servers are private ones
that `scripts/services` started for the run; their Redis and Redis Cluster write an fsynced
append-only file (`DLOCK_REDIS_AOF=yes`) and their PostgreSQL commits with
`synchronous_commit=on` (`DLOCK_POSTGRES_SYNC=on`), so that a crash keeps the fencing
counters: with `synchronous_commit=off` a crash lost the last commits and tokens repeated
("token went backwards", found by these runs). Every
duration is scaled to the store's **span**, how long it keeps a silent holder's hold: the
watchdog lease, or the session of a session store (ZooKeeper's session, etcd's lease TTL). The memory store (`memory://`) lives in one
process and cannot be tortured, so it has no row.

How to read a table (the checker's rules):

- **Fenced violations must be 0**: the harness's check of its own fenced resource (a token
  accepted out of order, or a fenced update lost), which refuses a stale token itself; it shows
  the resource worked, not that the store did. The store's tokens are judged apart: one issued
  twice for a name, or lower than an earlier grant's, is a violation of its own in the list.
- An **overlap** is a hold that another worker's hold began inside. It is **explained** only by
  a fault that hit the older holder and outlasted what its hold was vouched for: it began at
  least two thirds of a span (less the drift allowance and 50 ms) before the newer grant and
  had not healed by then; on a connection-bound store (for-update, advisory) a reset counts from
  its start; a restart counts only on a store that may forget its holds (Redis, whatever its
  persistence, and PostgreSQL, which `scripts/services` starts with `synchronous_commit=off`
  for the tests; these runs start it with `synchronous_commit=on`, PostgreSQL's default).
  Blips (0.2 to 0.5 of a span) and latency explain nothing. Anything else is **unexplained**
  (must be 0).
- **Told late** (must be 0): an overlapped holder must be told (`lost()`) by the newer grant plus
  the drift allowance (1 % of the lease + 5 ms); a paused one by the pause's end plus 250 ms; a
  connection-bound one, or one of a restarted store, within a lease of the fault's end.
  **Worst report delay** is how long after an overlap began its holder was told (negative:
  before).
- **Liveness held**: no `stuck` violation. After every fault some worker is granted something
  within the bound, and every name the fault's worker held is granted to a worker that asks
  for it once the store had to have freed it (a span and the 2 s slack after its last hold
  ended): an ask refused for its whole wait, with no fault on the asker and nobody granted
  the name meanwhile, is a stuck name. **Worst recovery** is the longest time
  from a fault's end to the next grant.
- **Fair pairs / overtaken**: pairs of fair-lock waiters judged, and the violations where a
  waiter was overtaken by one that began waiting later with no fault on it (must be 0); `n/a`
  where the backend has no fair lock.
- A critical section begins when a worker finds every hold it got still held; a hold whose lease
  ended on its way to the worker is not used. A `stuck` violation lists the holds open during
  the fault and what each worker said until the next grant.
- **Clock drift**: the first worker (and each that replaces it) runs on a clock at the given
  rate (libfaketime), faults aimed at a holder pick it, and critical sections last up to 3 s,
  past the lease, so that a fault finds it inside one. Within the drift allowance the rules
  above must hold; `crates/dlock-cli/tests/torture.rs` shows a clock 20 % slow caught.
- **Verdict**: `pass` when the run ended cleanly with no violation. Redis without AOF, and
  SQLite on one host, promise nothing across a server or disk loss (docs/guarantees.md): a
  restarted Redis without AOF starts its token counters from zero, which the checker reports.

Each row's command replays it (the seed fixes the fault schedule; timings still vary with the
machine).

EOF
        if [[ $(jq length <<<"$runs") == 0 ]]; then
            printf 'No runs recorded yet: run `scripts/reliability`.\n'
        else
            jq -r "$reliability_tables_jq" <<<"$runs"
        fi
    } >"$tmp"
    mv "$tmp" "$page"
}
