# bench/device/lib_step.sh — one bounded command of a device script, sourced by decode.sh and
# b1tp.sh. The caller sets D (its output folder, with runs.txt), BUDGET (seconds the script may
# spend) and T0 (its start, date +%s).
#
# step NAME SECONDS [VAR=VALUE...] CMD...: runs CMD under `timeout` (SECONDS, or what is left of
# the budget if less), output to $D/NAME.json and NAME.err when CMD ends in --json (a bench),
# else to $D/NAME.log (a test: its last line and FAIL lines are copied into runs.txt); skipped,
# and said so in runs.txt, when fewer than 6 s are left. Every command goes into runs.txt with
# its exit code and seconds.
step() {
    name=$1 lim=$2
    shift 2
    left=$((BUDGET - ($(date +%s) - T0)))
    if [ "$left" -lt "$lim" ] && [ "$left" -lt 6 ]; then
        echo "$name: skipped (the script's $BUDGET s are spent)" >>"$D/runs.txt"
        return
    fi
    [ "$lim" -gt "$left" ] && lim=$left
    t=$(date +%s)
    case "$*" in
    *--json*) timeout -k 3 "$lim" env "$@" >"$D/$name.json" 2>"$D/$name.err" ;;
    *) timeout -k 3 "$lim" env "$@" >"$D/$name.log" 2>&1 ;;
    esac
    rc=$?
    echo "$name: rc=$rc $(($(date +%s) - t)) s: $*" >>"$D/runs.txt"
    case "$*" in *--json*) ;; *) tail -1 "$D/$name.log" | sed "s/^/    /" >>"$D/runs.txt"
                                grep '^FAIL' "$D/$name.log" >>"$D/runs.txt" ;; esac
}
