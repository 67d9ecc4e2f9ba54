#!/usr/bin/env bash
# A scheduled job (cron / Airflow BashOperator): convert a checkpoint, keep the JSON report,
# fail loudly. Re-running after an interruption resumes where it stopped.
#   usage: samples/nightly-convert.sh CHECKPOINT OUT_DIR [RECIPE]
set -uo pipefail
ckpt=${1:?checkpoint}; out=${2:?output dir}; recipe=${3:-$(dirname "$0")/recipe-int8.toml}
report="${out%/}.report.json"

qstream convert "$ckpt" "$out" --recipe "$recipe" --json > "$report"
status=$?
case $status in
  0) echo "converted $ckpt -> $out; report in $report" ;;
  2) echo "bad usage or parameters (exit 2); see the message above" >&2 ;;
  *) echo "conversion failed (exit $status); re-run to resume" >&2 ;;
esac
exit $status
