#!/usr/bin/env bash
# Tutorial + scaling analysis on Hopper, H100 / H200 (sm_90), with the sm_90 table entry.
# Results: results/hopper-<date>/. Extra arguments, e.g. --iterations 20, are passed on.
exec python "$(dirname "$0")/run_benchmarks.py" --platform sm_90 --label hopper "$@"
