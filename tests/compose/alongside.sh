#!/usr/bin/env bash
# Runs COMMAND (make test's own suites) while the compose test's first-run steps go on beside it: the Docker engine
# (installed and started where none runs), the stand-in base, the image and Prometheus builds. They are mostly
# downloads and disk writes, so they take the suites little CPU, and `make test-compose` afterwards finds its images
# built. Exits with COMMAND's status; when COMMAND fails the preparation is stopped, otherwise waited for. A failed
# preparation fails nothing here: `make test-compose` retries it in the open and says why it cannot run.
# Usage: alongside.sh PYTHON COMMAND...
set -uo pipefail
python=$1; shift
here=$(dirname "$0")
log=$(mktemp "${TMPDIR:-/tmp}/zerobubble-compose-prepare.XXXXXX")
started=$SECONDS
# A session of its own, so that stopping it stops the builds it started and nothing else.
setsid bash -c '"$1/docker-engine.sh" && "$2" "$1/compose_stack.py"' _ "$here" "$python" >"$log" 2>&1 </dev/null &
prepare=$!
stop() { kill -TERM -- "-$prepare" 2>/dev/null; wait "$prepare"; rm -f "$log"; }
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
"$@"
status=$?
trap - INT TERM
if [ "$status" != 0 ]; then
    stop
    exit "$status"
fi
if wait "$prepare"; then
    echo "compose images ready beside the suites ($((SECONDS - started)) s): $(tail -n 1 "$log")"
    rm -f "$log"
else
    echo "compose preparation failed beside the suites ($log): $(tail -n 1 "$log")"
fi
exit 0
