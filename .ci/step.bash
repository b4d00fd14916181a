# Sourced by .ci/run and .ci/test: `step NAME COMMAND...` runs the command
# and then prints how long it took, `== NAME: SECONDS s`, so that the step
# that grew is seen in the log; `steps_total NAME` prints the time since
# the script began. A failing command stops the script (set -e), unprinted.
step() {
    local name=$1 began=$SECONDS
    shift
    "$@"
    echo "== $name: $((SECONDS - began)) s"
}

steps_total() {
    echo "== $1 in all: $SECONDS s"
}
