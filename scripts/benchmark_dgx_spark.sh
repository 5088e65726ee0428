#!/usr/bin/env bash
# Tutorial + scaling analysis on DGX Spark (sm_121), with the sm_121 table entry.
# Results: results/dgx_spark-<date>/. Extra arguments, e.g. --iterations 20, are passed on.
exec python "$(dirname "$0")/run_benchmarks.py" --platform sm_121 --label dgx_spark "$@"
