#!/usr/bin/env bash
# The django.tasks backend next to django-tasks-db in the shared peer harness: same job,
# same MariaDB, one run. Usage (from the project root):
#   bash bench/tasks_peer.sh            # N=5000, W=2, steady 200/s x 20 s
# Needs ../shared/peer-bench (or PEER_BENCH=...) and its venv (created by its run_all.sh).
# The harness is assembled in a temporary directory: symlinks to the shared files plus this
# repository's adapter (bench/peers/sqlqueuetasks), so nothing in shared/ is modified.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEER_BENCH="${PEER_BENCH:-$ROOT/../shared/peer-bench}"
[ -d "$PEER_BENCH" ] || PEER_BENCH=/work/shared/peer-bench
VENV="${PEERS_VENV:-/tmp/peersvenv}"
[ -x "$VENV/bin/python" ] || { echo "no peer venv at $VENV: run $PEER_BENCH/run_all.sh once"; exit 2; }
WORK="$(mktemp -d /tmp/tasks-peer.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
for f in bench_peer.py summarize.py benchlib djangotasks; do ln -s "$PEER_BENCH/$f" "$WORK/$f"; done
ln -s "$ROOT/bench/peers/sqlqueuetasks" "$WORK/sqlqueuetasks"
mkdir -p "$ROOT/bench/results"
OUT="$ROOT/bench/results/tasks-peer-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
export SQLQUEUE_SRC="$ROOT"
cd "$WORK"
rc=0
for peer in ${PEERS:-sqlqueuetasks djangotasks}; do
  echo "== $peer"
  "$VENV/bin/python" bench_peer.py --peer "$peer" --n "${N:-5000}" --workers "${WORKERS:-2}" --rate "${RATE:-200}" \
    --duration "${DURATION:-20}" --poll "${POLL:-0.1}" --max-backlog "${MAX_BACKLOG:-1000}" \
    --out "$OUT" --run-id "tasks-peer" || rc=1
done
"$VENV/bin/python" summarize.py "$OUT" || rc=1
echo "results: $OUT"
exit $rc
