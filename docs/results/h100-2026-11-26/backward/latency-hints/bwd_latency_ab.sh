# run from the repository root after sourcing the bundle; writes $OUT/bwd-latency-ab.jsonl
SETTINGS="0,0,0,0 2,4,0,0 6,6,0,0 0,0,2,4 2,4,2,4 6,6,2,4"
for s in $SETTINGS; do FMHA_BWD_LATENCY=$s python3 .scratch/bwd_latency_ab.py compile > $OUT/compile-$s.log 2>&1 & done; wait
echo "compiled"; grep -il "error\|traceback" $OUT/compile-*.log
for pass in 1 2; do for s in $SETTINGS; do FMHA_BWD_LATENCY=$s python3 .scratch/bwd_latency_ab.py time 2>>$OUT/time-errors.log | tee -a $OUT/bwd-latency-ab.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print(d['setting'], d['shape'], '%.3f'%d['ours_ms'], '%.3f'%d['cudnn_ms'], '%.3f'%d['ours_over_cudnn'], d['grads'])"; done; done
