#!/usr/bin/env bash
# Tutorial + scaling analysis on B300 (sm_103), with the sm_103 table entry.
# Results: results/b300-<date>/. Extra arguments, e.g. --iterations 20, are passed on.
exec python "$(dirname "$0")/run_benchmarks.py" --platform sm_103 --label b300 "$@"
