#!/usr/bin/env bash
# A scheduled job (cron / Airflow BashOperator): convert a checkpoint, keep the JSON report of
# the last good run, fail loudly. Re-running after an interruption resumes where it stopped.
#   usage: samples/nightly-convert.sh CHECKPOINT OUT_DIR [RECIPE]
# Exit codes: 0 converted (or already complete), 1 conversion failed, 2 bad usage.
set -uo pipefail
usage="usage: $(basename "$0") CHECKPOINT OUT_DIR [RECIPE]"
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "$usage" >&2
  exit 2
fi
ckpt=$1; out=$2; recipe=${3:-$(dirname "$0")/recipe-int8.toml}
report="${out%/}.report.json"

if ! command -v qstream >/dev/null 2>&1; then
  echo "qstream is not on PATH (pip install qstream-zarr, or activate its environment)" >&2
  exit 1
fi
if [ ! -e "$ckpt" ]; then
  echo "checkpoint not found: $ckpt" >&2
  exit 1
fi

# The report goes to a temporary file first: a failed run keeps the last good report.
tmp="$report.partial.$$"
trap 'rm -f "$tmp"' EXIT
qstream convert "$ckpt" "$out" --recipe "$recipe" --json > "$tmp"
status=$?
case $status in
  0) mv -f "$tmp" "$report"
     echo "converted $ckpt -> $out; report in $report" ;;
  2) echo "bad usage or parameters (exit 2); see the message above" >&2 ;;
  130|137|143) echo "conversion interrupted (exit $status); re-run to resume" >&2 ;;
  *) if [ -d "$out" ]; then
       echo "conversion failed (exit $status); fix the cause above and re-run: finished tensors are kept" >&2
     else
       echo "conversion failed (exit $status); see the message above" >&2
     fi ;;
esac
exit $status
