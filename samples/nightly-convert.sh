#!/usr/bin/env bash
# A scheduled job (cron / systemd / Airflow BashOperator): convert a checkpoint, keep the JSON
# report of the last real conversion, say what happened in one line, fail loudly. Re-running
# after an interruption (Ctrl-C, SIGTERM, a timeout, a kill) resumes where it stopped.
#   usage: samples/nightly-convert.sh CHECKPOINT OUT_DIR [RECIPE]
#   QSTREAM_TIMEOUT=2h  stop the conversion after that long (GNU timeout syntax), resumable
# Exit codes: 0 converted or already complete, 1 conversion failed, 2 bad usage or a refused
#   plan (nothing done), 75 another qstream process is writing OUT_DIR (temporary: retry
#   later), 124 timed out, 130 interrupted, 143 terminated (SIGTERM).
set -uo pipefail
usage="usage: $(basename "$0") CHECKPOINT OUT_DIR [RECIPE]"
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "$usage" >&2
  exit 2
fi
ckpt=$1; out=$2; recipe=${3:-$(dirname "$0")/recipe-int8.toml}
report="${out%/}.report.json"
# Every line on stderr: an ISO 8601 UTC timestamp, the script's name, what happened; the first
# says "start: ...", the last "end: exit N after S s"; qstream's own lines (error:, warning:)
# in between, stamped too ("... nightly-convert: qstream: error: ...").
log() { echo "$(date -u '+%Y-%m-%dT%H:%M:%SZ') nightly-convert: $*" >&2; }
stamped() { while IFS= read -r line || [ -n "$line" ]; do log "qstream: $line"; done; }
started=$SECONDS
finish() { log "end: exit $1 after $((SECONDS - started)) s"; exit "$1"; }
log "start: $ckpt -> $out (recipe $recipe)"

if ! command -v qstream >/dev/null 2>&1; then
  log "qstream is not on PATH (pip install -e '.[s3]' from a qstream checkout, or pip install qstream-zarr; or activate its environment)"
  finish 1
fi
if [[ "$ckpt" != *://* ]] && [ ! -e "$ckpt" ]; then  # (s3://... is read by qstream itself)
  log "checkpoint not found: $ckpt"
  finish 2
fi

# The report goes to a temporary file first: a failed or no-op run keeps the last real report
# (and makes no folder: OUT_DIR's may not exist yet; qstream makes it once the run is decided).
tmp=$(mktemp "${TMPDIR:-/tmp}/nightly-convert.XXXXXX") || finish 1
keep_report() {  # the new report in place of the last, whole (a rename beside it)
  mkdir -p "$(dirname "$report")" && cp "$tmp" "$report.partial.$$" &&
    mv -f "$report.partial.$$" "$report"
}
child=
on_term() {  # cron/systemd/Airflow stop the job: pass it on, say so, exit as qstream does
  log "SIGTERM received: stopping the conversion (re-run to resume)"
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null && wait "$child"
  exec 3>&-
  wait "$filter" 2>/dev/null
  rm -f "$tmp"
  finish 143
}
trap on_term TERM
trap 'rm -f "$tmp" "$report.partial.$$"' EXIT

cmd=(qstream convert "$ckpt" "$out" --recipe "$recipe" --json)
if [ -n "${QSTREAM_TIMEOUT:-}" ]; then
  cmd=(timeout --signal=TERM "$QSTREAM_TIMEOUT" "${cmd[@]}")
fi
exec 3> >(stamped)  # (qstream's stderr, a timestamp on each line)
filter=$!
"${cmd[@]}" > "$tmp" 2>&3 &
child=$!
wait "$child"
status=$?
child=
exec 3>&-
wait "$filter" 2>/dev/null  # (its last lines logged before the script's own)
case $status in
  0) if grep -q '"already_complete": *true' "$tmp"; then
       if [ -f "$report" ]; then
         log "$out is already complete; nothing converted (last report kept: $report)"
       else  # finished by a run that was stopped before it could keep its report
         keep_report
         log "$out is already complete; nothing converted (no earlier report: this one in $report)"
       fi
     else
       keep_report
       log "converted $ckpt -> $out; report in $report"
     fi ;;
  2) log "bad usage, or a plan qstream refused before any work (exit 2); see the message above" ;;
  75) log "$out is being written by another qstream process (exit 75); nothing done: retry later" ;;
  124) log "timed out after $QSTREAM_TIMEOUT (exit 124); re-run to resume" ;;
  130|137|143) log "conversion interrupted (exit $status); re-run to resume" ;;
  *) if [ -d "$out" ]; then
       log "conversion failed (exit $status); fix the cause above and re-run: finished tensors are kept"
     else
       log "conversion failed (exit $status); see the message above"
     fi ;;
esac
finish $status
