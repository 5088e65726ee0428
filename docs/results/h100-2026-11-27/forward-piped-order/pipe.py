import io, re, sys
from collections import Counter
import math
import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, ScalarConstraint, CallingConvention, KernelSignature, export_kernel)
from cutile_fmha.steps.compile import sass, resource_usage

ConstInt = ct.Constant[int]

def arr(rank, dtype=ct.bfloat16):
    return ArrayConstraint(dtype, rank, index_dtype=ct.int32, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False,
                           stride_constant=(None,) * (rank - 1) + (1,),
                           stride_divisible_by=(8,) * (rank - 1) + (1,),
                           shape_divisible_by=(1,) * (rank - 2) + (128, 16), base_addr_divisible_by=16)

def load_k(K, b, h, j, D, N):
    return ct.load(K, index=(b, h, 0, j), shape=(1, 1, D, N), order=(0, 1, 3, 2),
                   padding_mode=ct.PaddingMode.ZERO, latency=2).reshape((D, N))

def load_v(V, b, h, j, D, N):
    return ct.load(V, index=(b, h, j, 0), shape=(1, 1, N, D),
                   padding_mode=ct.PaddingMode.ZERO, latency=4).reshape((N, D))

@ct.kernel(occupancy=1, num_worker_warps=8)
def plain(Q, K, V, Out, scale: float, D: ConstInt, M: ConstInt, N: ConstInt):
    t, h, b = ct.bid(0), ct.bid(1), ct.bid(2)
    q = ct.load(Q, index=(b, h, t, 0), shape=(1, 1, M, D)).reshape((M, D))
    m = ct.full((M, 1), -math.inf, dtype=ct.float32)
    l = ct.full((M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((M, D), 0.0, dtype=ct.float32)
    for j in range(K.shape[2] // N):
        s = ct.mma(q, load_k(K, b, h, j, D, N), ct.full((M, N), 0.0, dtype=ct.float32))
        m_new = ct.maximum(m, ct.max(s, axis=-1, keepdims=True) * scale)
        p = ct.exp2(s * scale - m_new, flush_to_zero=True)
        alpha = ct.exp2(m - m_new, flush_to_zero=True)
        l = l * alpha + ct.sum(p, axis=-1, keepdims=True)
        acc = ct.mma(p.astype(Q.dtype), load_v(V, b, h, j, D, N), acc * alpha)
        m = m_new
    out = ct.truediv(acc, l, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(b, h, t, 0), tile=out.reshape((1, 1, M, D)).astype(Out.dtype))

@ct.kernel(occupancy=1, num_worker_warps=8)
def piped(Q, K, V, Out, scale: float, D: ConstInt, M: ConstInt, N: ConstInt):
    """S of tile j+1 issued before P V of tile j (FA3's order)."""
    t, h, b = ct.bid(0), ct.bid(1), ct.bid(2)
    q = ct.load(Q, index=(b, h, t, 0), shape=(1, 1, M, D)).reshape((M, D))
    m = ct.full((M, 1), -math.inf, dtype=ct.float32)
    l = ct.full((M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((M, D), 0.0, dtype=ct.float32)
    tiles = K.shape[2] // N
    s = ct.mma(q, load_k(K, b, h, 0, D, N), ct.full((M, N), 0.0, dtype=ct.float32))
    for j in range(tiles - 1):
        m_new = ct.maximum(m, ct.max(s, axis=-1, keepdims=True) * scale)
        p = ct.exp2(s * scale - m_new, flush_to_zero=True)
        alpha = ct.exp2(m - m_new, flush_to_zero=True)
        l = l * alpha + ct.sum(p, axis=-1, keepdims=True)
        s = ct.mma(q, load_k(K, b, h, j + 1, D, N), ct.full((M, N), 0.0, dtype=ct.float32))
        acc = ct.mma(p.astype(Q.dtype), load_v(V, b, h, j, D, N), acc * alpha)
        m = m_new
    m_new = ct.maximum(m, ct.max(s, axis=-1, keepdims=True) * scale)
    p = ct.exp2(s * scale - m_new, flush_to_zero=True)
    alpha = ct.exp2(m - m_new, flush_to_zero=True)
    l = l * alpha + ct.sum(p, axis=-1, keepdims=True)
    acc = ct.mma(p.astype(Q.dtype), load_v(V, b, h, tiles - 1, D, N), acc * alpha)
    out = ct.truediv(acc, l, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(b, h, t, 0), tile=out.reshape((1, 1, M, D)).astype(Out.dtype))

KERNELS = {"plain": plain, "piped": piped}

def cubin(kernel, D, M, N, occupancy=None):
    params = [arr(4), arr(4), arr(4), arr(4), ScalarConstraint(ct.float32), D, M, N]
    buf = io.BytesIO()
    export_kernel(kernel, [KernelSignature(params, CallingConvention.cutile_python_v1())], buf,
                  gpu_code="sm_90", output_format="cubin")
    return buf.getvalue()

def counts(text):
    c = Counter()
    for line in text.splitlines():
        mm = re.search(r'\b(HGMMA|WARPGROUP\.DEPBAR\.LE gsb0, 0x[0-9a-f]+|MUFU\.EX2|LDS|STS|LDSM|STL|LDL)\b', line)
        if mm: c[mm.group(1)] += 1
    return dict(c)

if __name__ == "__main__":
    for name in sys.argv[1].split(","):
        for D, M, N in [(128, 128, 128), (64, 128, 128)]:
            cb = cubin(KERNELS[name], D, M, N)
            text = sass(cb)
            open(f"/work/main/.scratch/batched/{name}-d{D}.sass", "w").write(text)
            print(name, D, M, N, counts(text), resource_usage(cb).strip().splitlines()[-1][:50])

def hinted(kernel, hints):
    from cutile_fmha.steps.launcher import with_hints
    return with_hints(kernel, hints)
