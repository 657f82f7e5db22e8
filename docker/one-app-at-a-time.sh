#!/bin/sh
# Installed as /app/bin/flwr-clientapp and /app/bin/flwr-serverapp (first on PATH), the
# programs Flower's SuperExec starts by name, one per task it claims. A claim lapses when its
# process has not reported within 30 s; the SuperExec then starts another process for the same
# task and leaves the first running. Under CPU contention (importing takes longer than 30 s)
# that feeds itself: every process slows the next, and they pile up by the dozen. Here at most
# one of them runs per container at a time: a later one waits for the lock up to
# CLUSTERFED_APP_LOCK_WAIT seconds (20: by then its own claim has lapsed, and Flower hands the
# task out again) and otherwise exits without starting. --close: the app's own children (the
# warm worker) do not inherit the lock.
#
# An app that holds the lock for longer than CLUSTERFED_APP_MAX_SECONDS (900) while another
# waits is taken for hung (a SuperNode works on one message at a time, so a newer task means the
# holder's message was answered or given up, and one message's work takes far less): the
# waiting process ends it (TERM, then KILL) and runs in its place. Without that bound one hung
# app would keep its device out of every later round. 0 turns it off.
name=$(basename "$0")
here=$(cd "$(dirname "$0")" && pwd)
# the real program: the first of that name on PATH outside this folder
real=$(PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vx "$here" | paste -sd:) command -v "$name") \
    || { echo "$0: no other $name on PATH" >&2; exit 127; }
lock=${CLUSTERFED_APP_LOCK_DIR:-/tmp}/$name.lock
wait=${CLUSTERFED_APP_LOCK_WAIT:-20}
max=${CLUSTERFED_APP_MAX_SECONDS:-900}
busy=75  # flock's exit status when the lock stayed taken (EX_TEMPFAIL)

# run: take the lock (waiting up to $wait s), note which process holds it and since when
# ($lock.pid, its mtime), and become the real program
run() {
    flock --close --conflict-exit-code "$busy" --wait "$wait" "$lock" \
        sh -c 'echo $$ > "$0.pid"; exec "$@"' "$lock" "$real" "$@"
}

run "$@"
status=$?
[ "$status" = "$busy" ] || exit "$status"  # the app's own exit status
[ "$max" -gt 0 ] 2>/dev/null || exit 1
holder=$(cat "$lock.pid" 2>/dev/null)
case $holder in '' | *[!0-9]*) exit 1 ;; esac
age=$(( $(date +%s) - $(stat -c %Y "$lock.pid" 2>/dev/null || date +%s) ))
# only a hung app of this name: not a pid reused by something else
if [ "$age" -gt "$max" ] && tr '\0' ' ' < "/proc/$holder/cmdline" 2>/dev/null | grep -q "$name"; then
    echo "$0: $name (pid $holder) has held the lock for ${age} s (> CLUSTERFED_APP_MAX_SECONDS=$max) while a new task waits: ending it" >&2
    kill -TERM "$holder" 2>/dev/null
    sleep 5
    kill -KILL "$holder" 2>/dev/null
    run "$@"
    status=$?
    [ "$status" = "$busy" ] && exit 1
    exit "$status"
fi
exit 1  # the lock stayed taken: this process never ran the app
