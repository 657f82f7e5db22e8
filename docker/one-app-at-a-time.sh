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
name=$(basename "$0")
here=$(cd "$(dirname "$0")" && pwd)
# the real program: the first of that name on PATH outside this folder
real=$(PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vx "$here" | paste -sd:) command -v "$name") \
    || { echo "$0: no other $name on PATH" >&2; exit 127; }
exec flock --close --wait "${CLUSTERFED_APP_LOCK_WAIT:-20}" "${CLUSTERFED_APP_LOCK_DIR:-/tmp}/$name.lock" "$real" "$@"
