import io, re, sys
import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature, export_kernel)
from cutile_fmha.steps.compile import sass, resource_usage

def arr(rank, dtype=ct.bfloat16):
    return ArrayConstraint(dtype, rank, index_dtype=ct.int32, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False,
                           stride_constant=(None,) * (rank - 1) + (1,),
                           stride_divisible_by=(8,) * (rank - 1) + (1,),
                           shape_divisible_by=(128,) * rank, base_addr_divisible_by=16)

@ct.kernel(occupancy=1, num_worker_warps=8)
def separate(A, B, C, Out):
    i = ct.bid(0)
    acc1 = ct.full((128, 128), 0.0, dtype=ct.float32)
    acc2 = ct.full((128, 128), 0.0, dtype=ct.float32)
    for j in range(A.shape[1] // 128):
        a = ct.load(A, (i, j), shape=(128, 128))
        b = ct.load(B, (j, 0), shape=(128, 128))
        c = ct.load(C, (j, 0), shape=(128, 128))
        acc1 = ct.mma(a, b, acc1)
        acc2 = ct.mma(a, c, acc2)
    ct.store(Out, (i, 0), (acc1 + acc2).astype(Out.dtype))

@ct.kernel(occupancy=1, num_worker_warps=8)
def batched(A, B, C, Out):
    i = ct.bid(0)
    acc = ct.full((2, 128, 128), 0.0, dtype=ct.float32)
    for j in range(A.shape[1] // 128):
        a = ct.load(A, (i, j), shape=(128, 128))
        b = ct.load(B, (j, 0), shape=(128, 128))
        c = ct.load(C, (j, 0), shape=(128, 128))
        a2 = ct.cat((a.reshape((1, 128, 128)), a.reshape((1, 128, 128))), 0)
        bc = ct.cat((b.reshape((1, 128, 128)), c.reshape((1, 128, 128))), 0)
        acc = ct.mma(a2, bc, acc)
    s = ct.sum(acc, axis=0)
    ct.store(Out, (i, 0), s.astype(Out.dtype))

@ct.kernel(occupancy=1, num_worker_warps=8)
def batched3d(A3, B3, Out):
    i = ct.bid(0)
    acc = ct.full((2, 128, 128), 0.0, dtype=ct.float32)
    for j in range(A3.shape[2] // 128):
        a = ct.load(A3, (0, i, j), shape=(2, 128, 128))
        b = ct.load(B3, (0, j, 0), shape=(2, 128, 128))
        acc = ct.mma(a, b, acc)
    s = ct.sum(acc, axis=0)
    ct.store(Out, (i, 0), s.astype(Out.dtype))

def show(name, kernel, params):
    buf = io.BytesIO()
    export_kernel(kernel, [KernelSignature(params, CallingConvention.cutile_python_v1())], buf,
                  gpu_code="sm_90", output_format="cubin")
    text = sass(buf.getvalue())
    ops = re.findall(r'\b(HGMMA\.[0-9x]+\S*|WARPGROUP\.\S+|LDS\S*|STS\S*|LDSM\S*|UTMALDG\S*|FFMA|HMMA\S*)', text)
    from collections import Counter
    c = Counter(o.split('.')[0] + ('.' + o.split('.')[1] if o.startswith(('HGMMA', 'WARPGROUP')) else '') for o in ops)
    print(name, dict(c), resource_usage(buf.getvalue()).strip().splitlines()[-1][:90])
    open(f"/work/main/.scratch/batched/{name}.sass", "w").write(text)

show("separate", separate, [arr(2), arr(2), arr(2), arr(2, ct.float32)])
show("batched", batched, [arr(2), arr(2), arr(2), arr(2, ct.float32)])
show("batched3d", batched3d, [arr(3), arr(3), arr(2, ct.float32)])
