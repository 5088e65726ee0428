"""Host time of one cuTile launch by how its array arguments are passed: torch tensors
(cuTile converts each through DLPack), objects with a __cuda_array_interface__ dict made
once, or ints (a scalar parameter). Six array parameters, two of them read and written;
each variant in rotating rounds, 20000 launches a round, median per launch."""
import statistics, time, torch
import cuda.tile as ct


@ct.kernel
def six(A, B, C, D, E, F):
    ct.store(B, (0,), ct.load(A, (0,), (16,)))


class Interface:
    __slots__ = ("tensor", "__cuda_array_interface__")
    TYPESTR = {torch.float32: "<f4", torch.int32: "<i4"}

    def __init__(self, t):
        self.tensor = t
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape), "typestr": self.TYPESTR[t.dtype],
            "data": (t.data_ptr(), False),
            "strides": tuple(s * t.element_size() for s in t.stride()), "version": 3}


dev = torch.device("cuda")
stream = torch.cuda.current_stream().cuda_stream
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
ts = [torch.randn(64, device=dev) for _ in range(2)] + \
     [torch.randn(8, 4, 16, 128, device=dev) for _ in range(4)]
wrapped = [Interface(t) for t in ts]
variants = {
    "6 tensors": tuple(ts),
    "6 interfaces": tuple(wrapped),
    "2 tensors + 4 interfaces": tuple(ts[:2]) + tuple(wrapped[2:]),
    "2 tensors + 4 ints": tuple(ts[:2]) + (0, 0, 0, 0),
    "2 interfaces + 4 ints": tuple(wrapped[:2]) + (0, 0, 0, 0),
}
for name, args in variants.items():
    ts[1].fill_(float("nan"))
    ct.launch(stream, (1, 1, 1), six, args)
    torch.cuda.synchronize()
    assert torch.equal(ts[1][:16], ts[0][:16]), name
    print(f"  {name}: output checked", flush=True)
N, ROUNDS = 20000, 7
times = {name: [] for name in variants}
names = list(variants)
for r in range(ROUNDS):
    for name in names[r % len(names):] + names[:r % len(names)]:
        args = variants[name]
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for i in range(N):
            ct.launch(stream, (1, 1, 1), six, args)
        t1 = time.perf_counter_ns()
        times[name].append((t1 - t0) / N / 1e3)
torch.cuda.synchronize()
print(f"us per launch, median of {ROUNDS} rounds of {N} launches (min-max):")
for name in names:
    v = times[name]
    print(f"  {name:28s} {statistics.median(v):6.2f} ({min(v):.2f}-{max(v):.2f})")
