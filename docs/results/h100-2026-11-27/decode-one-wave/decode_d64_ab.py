"""D=64 at 32 and 64 columns (8 and 16 new tokens at 32/8 heads): the one-wave launch on
256-key tiles (splits of 2048 keys and more; cutile_fmha) against the committed package,
where D=64 has no one-wave launch (cutile_fmha_old), through attention_with_kvcache; causal
at each sequence's last key, bf16, CUDA graphs, 3 rotating rounds. Controls (the same
launch in both): splits of 1024 keys (2 x 8k), past one wave (64 x 4k), paged blocks of 16."""
import statistics, torch
import triton.testing as tt
import cutile_fmha as new
import cutile_fmha_old as old
from h100_decode_probe import paged, rounds
name = torch.cuda.get_device_name()
print(name, torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in name else 3.35e12
D = 64


def case(q_len, batch, cache, layout="dense"):
    g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len)
    q = torch.randn(batch, 32, q_len, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(batch, 8, cache, D, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    if layout == "ragged":
        lens = torch.randint(cache // 8, cache + 1, (batch,), device="cuda", generator=g,
                             dtype=torch.int32)
    else:
        lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    table = None
    if layout.startswith("paged"):
        (k, v), table = paged(k, v, int(layout[5:]), g)
    fns = {"committed": lambda: old.attention_with_kvcache(q, k, v, lens, block_table=table),
           "one-wave": lambda: new.attention_with_kvcache(q, k, v, lens, block_table=table)}
    d = (fns["committed"]().float() - fns["one-wave"]().float()).abs().max().item()
    assert d < 2e-2, d
    med = rounds(fns)
    nbytes = 2 * 8 * int(lens.sum()) * D * 2
    print(f"D=64 {4 * q_len} columns {layout:7s} batch {batch:2d} x {cache:5d}: "
          + ", ".join(f"{n} {med[n]:7.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)"
                      for n in fns)
          + f"; new / committed {med['one-wave'] / med['committed']:.3f}", flush=True)


if __name__ == "__main__":
    for q_len in (8, 16):
        for batch, cache in ((16, 4096), (1, 32768), (4, 8192), (8, 16384), (2, 8192),
                             (64, 4096)):
            case(q_len, batch, cache)
        case(q_len, 16, 32768, "ragged")
        for block in (16, 32, 64, 256):
            case(q_len, 1, 32768, f"paged{block}")
        for block in (32, 256):
            case(q_len, 16, 4096, f"paged{block}")
