source .gpu-bundle/gpu-env.sh
L='[[100,100],[0,0],[257,257],[1,1],[31,64]]'
L2='[[100,100],[257,257],[1,1],[31,64]]'
i=0
for c in "{\"lengths\":$L,\"max\":16}" "{\"lengths\":$L,\"max\":257}" "{\"lengths\":$L,\"max\":16,\"atomic\":false}" \
         "{\"lengths\":$L2,\"max\":16}" "{\"lengths\":[[257,257]],\"max\":16}" "{\"lengths\":[[257,257]],\"max\":16,\"kv_heads\":8}" \
         "{\"lengths\":[[100,100]],\"max\":16}" "{\"lengths\":[[257,257]],\"max\":16,\"causal\":false}" "{\"lengths\":[[257,257]],\"max\":128}"; do
  i=$((i+1)); echo "== case $i $c"
  CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 hangprobe.py "$c" 2>&1 | grep -v Warning | tail -12; echo "rc ${PIPESTATUS[0]}"
done
