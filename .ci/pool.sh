# A bounded pool of background jobs, for scripts that run many independent
# checks (autobahn/run.sh's targets, fuzz/run.sh's targets). Source it, then:
#
#   pool_run MAX START ITEM...   runs `START ITEM` for each ITEM, at most MAX
#                                at a time, each in the background;
#   pool_wait ITEM               waits for ITEM's job (in any order, any
#                                time after pool_run) and returns its status.
#
# START runs in a subshell of its own; what it prints is its own business
# (both scripts send it to a log, and show the log when the job is done).

declare -A pool_pids=()

pool_run() {
    local max=$1 start=$2
    shift 2
    local item
    for item in "$@"; do
        while (($(jobs -rp | wc -l) >= max)); do
            wait -n || true
        done
        "$start" "$item" &
        pool_pids[$item]=$!
    done
}

pool_wait() {
    local status=0
    wait "${pool_pids[$1]}" || status=$?
    return "$status"
}
