#!/bin/sh
# A worker of Souq's batch queue in POSIX sh and curl: the /sched API's pull model (docs/jobs.md).
#   SOUQ_API=http://127.0.0.1:4280 SOUQ_TOKEN=... sh examples/sched-worker.sh [WORKER_ID]
# It reads JSON with grep and sed, so it takes only jobs whose command is one shell line without
# a double quote or a backslash (argv lists are left to other workers); it runs one job at a
# time in its own directory, ignores the job's cpus, memory and env, and stops a cancelled job
# with SIGTERM to its shell.
set -u
id=${1:-sh-$$} api=${SOUQ_API:-http://127.0.0.1:4280}
call() { curl -sS -H "Authorization: Bearer ${SOUQ_TOKEN:-}" "$@"; }
post() { call -o /dev/null -w '%{http_code}' -X POST -d "${3:-}" "$api/sched/$1/$2?worker=$id"; }
while :; do
  call -f "$api/sched/jobs" | # (-f: an error, e.g. a bad token, is said on stderr)
    grep -o '"name":"[^"]*","state":"pending","spec":{"name":"[^"]*","command":"[^"\\]*"' |
    sed 's/^"name":"\([^"]*\)".*"command":"\(.*\)"$/\1 \2/' |
    while read -r name cmd; do
      [ "$(post claim "$name")" = 200 ] || continue # 409: another worker has it
      post started "$name" >/dev/null
      sh -c "$cmd" & pid=$!
      while sleep 1 && kill -0 "$pid" 2>/dev/null; do # each second: keep the lease, heed a cancel
        post renew "$name" >/dev/null
        call "$api/sched/cancellations?worker=$id" | grep -q "\"name\":\"$name\"" && kill "$pid"
      done
      wait "$pid"; code=$?
      post stopped "$name" "{\"exit_code\":$code}" >/dev/null
      break # the queue moved while it ran: list it again
    done
  sleep 1
done
