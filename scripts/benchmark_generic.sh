#!/usr/bin/env bash
# Tutorial + scaling analysis on any GPU cuTile supports, with that GPU's own table entry
# (the default entry where the table has none). Results: results/<arch>-<date>/.
arch=$(python -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())" 2>/dev/null || echo generic)
exec python "$(dirname "$0")/run_benchmarks.py" --label "$arch" "$@"
