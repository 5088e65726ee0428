"""Decoding from a KV cache on the GPU: attention_with_kvcache against a float64 reference
computed sequence by sequence.

Ragged lengths include 0, 1 and lengths that are no multiple of a split, a key tile or a
block; dense caches hold NaN outside each sequence and paged caches come with shuffled
block tables whose entries past a sequence's end are garbage, so a key read or counted
outside its sequence fails. Every split count runs, and a CUDA graph replays a call."""

import dataclasses
import gc
import math
import weakref

import pytest
import torch

from cutile_fmha import attention_with_kvcache
from cutile_fmha.platforms import entry_for

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 2e-2}  # of the largest |output|


def reference(query, keys, values, starts, ends, causal, scale):
    """(out, lse) float64: each sequence's rows against its keys starts[b]..ends[b]-1 of
    keys[b], values[b] ((kv_heads, capacity, D) each)."""
    batch, heads, q_len, _ = query.shape
    out = torch.zeros(query.shape[:-1] + values.shape[-1:], dtype=torch.float64,
                      device=query.device)
    lse = torch.full(query.shape[:-1], -math.inf, dtype=torch.float64, device=query.device)
    for b in range(batch):
        k, v = (t[b][:, starts[b]:ends[b]].double() for t in (keys, values))
        k, v = (t.repeat_interleave(heads // t.shape[0], 0) for t in (k, v))
        scores = query[b].double() @ k.transpose(-1, -2) * scale
        if causal:
            key_index = torch.arange(starts[b], ends[b], device=query.device)[None, :]
            row = torch.arange(q_len, device=query.device)[:, None]
            scores = scores.masked_fill(key_index > ends[b] - q_len + row, -math.inf)
        lse[b] = torch.logsumexp(scores, -1)
        out[b] = (torch.exp(scores - lse[b][..., None]).nan_to_num(0.0) @ v)
    return out, lse


def dense_cache(batch, kv_heads, capacity, head_dim, dtype, starts, ends, generator,
                value_dim=None):
    caches = [torch.randn(batch, kv_heads, capacity, d, generator=generator, device="cuda",
                          dtype=dtype) for d in (head_dim, value_dim or head_dim)]
    for cache in caches:  # what is outside a sequence must never count
        for b in range(batch):
            cache[b, :, :starts[b]] = math.nan
            cache[b, :, ends[b]:] = math.nan
    return caches


def paged_cache(batch, kv_heads, capacity, head_dim, dtype, block_size, ends, generator,
                value_dim=None):
    """(key_cache, value_cache, block_table, per-sequence dense views for the reference):
    NaN in every block row that holds none of a sequence's keys (a last block's rows past
    its sequence's end, and the blocks no sequence uses)."""
    per_sequence = math.ceil(capacity / block_size)
    blocks = batch * per_sequence + 5
    caches = [torch.randn(blocks, block_size, kv_heads, d, generator=generator, device="cuda",
                          dtype=dtype) for d in (head_dim, value_dim or head_dim)]
    table = torch.randperm(blocks, generator=generator, device="cuda")[:batch * per_sequence]
    table = table.reshape(batch, per_sequence).int()
    unused = torch.ones(blocks, block_size, dtype=torch.bool, device="cuda")
    for b in range(batch):  # entries past the sequence's last block point anywhere, or nowhere
        used = math.ceil(ends[b] / block_size)
        for i in range(used):
            unused[table[b, i], :ends[b] - i * block_size] = False
        table[b, used:] = torch.randint(-3, blocks + 3, (per_sequence - used,),
                                        generator=generator, device="cuda", dtype=torch.int32)
    for cache in caches:
        cache[unused] = math.nan
    dense = [cache[table.clamp(0, blocks - 1).long()].flatten(1, 2).transpose(1, 2)
             for cache in caches]
    return caches, table, dense


CASES = [
    # batch, heads, kv_heads, q_len, head_dim, capacity, lengths (None: full), leftpad
    (3, 32, 8, 1, 128, 777, (0, 1, 777), False),
    (2, 32, 8, 1, 128, 4096, None, False),
    (3, 12, 2, 3, 256, 513, (513, 200, 3), True),
    (4, 16, 16, 5, 64, 300, (5, 130, 299, 300), False),
    (2, 64, 8, 2, 128, 1000, (1000, 1), True),
    # 128 columns (heads of a K/V head x query rows): on a dense cache, as the products' M
    # side (DecodeLaunch.rows_columns), at the wide launch
    (2, 32, 8, 32, 128, 1000, (1000, 40), True),
    (2, 16, 2, 16, 256, 700, (700, 300), False),
    # 64 and 128 columns on the M side with lengths 0 and 1 (rows that see no key)
    (3, 32, 8, 16, 128, 1500, (1500, 0, 1), True),
    (3, 64, 8, 16, 64, 900, (0, 1, 900), False),
    # 32 columns on a grid of at most one CTA per SM: the one-wave launch (DecodeLaunch),
    # at D=128 unsplit only here (splits of at least 1024 keys)
    (2, 32, 8, 8, 128, 2100, (2100, 40), True),
    (3, 64, 8, 4, 64, 900, (900, 0, 333), False),
    (2, 32, 8, 8, 256, 600, (600, 77), True),
    # 64 columns (on a dense cache: the M side at the launch's own hints)
    (2, 32, 8, 16, 128, 2100, (2100, 40), False),
    (2, 32, 8, 16, 256, 800, (800, 123), True),
    # D=64 on 256-key tiles at 16, 32 and 64 columns (unsplit only here: splits of 2048
    # keys), 16 columns with the transposed products
    (2, 32, 8, 4, 64, 2300, (2300, 5), True),
    (2, 64, 8, 2, 64, 4100, (4100, 2049), False),
    (2, 32, 8, 8, 64, 2300, (2300, 1), True),
    (2, 32, 8, 16, 64, 4100, (4100, 517), False),
    # a chunk of new tokens past one CTA's 128 columns, in tiles of 128 (COLUMN_TILES):
    # 2 tiles of 4 heads x 64 rows, 16 tiles of one head's 128 rows, 8 of one head's 128
    # of 1024 rows, 4 at D=256 (the 4th head's past the group of 3), 4 of 512 rows (the
    # last past the chunk's 300); lengths shorter than the chunk and 0
    (3, 32, 8, 33, 128, 1500, (1500, 0, 40), True),
    (2, 16, 2, 200, 128, 2100, (2100, 300), False),
    (2, 8, 8, 1000, 64, 3000, (3000, 1001), True),
    (2, 12, 4, 129, 256, 900, (900, 129), False),
    (2, 8, 8, 300, 64, 1200, (1200, 250), True),
]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("splits", [1, 3, None])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-h{}-kv{}-q{}-d{}-n{}".format(*c[:6]))
def test_dense_cache_matches_the_reference(case, causal, splits, dtype):
    batch, heads, kv_heads, q_len, head_dim, capacity, lengths, leftpad = case
    dtype = DTYPES[dtype]
    generator = torch.Generator(device="cuda").manual_seed(hash(case) % 1000)
    ends = list(lengths or (capacity,) * batch)
    starts = [min(e, 7 * b) for b, e in enumerate(ends)] if leftpad else [0] * batch
    query = torch.randn(batch, heads, q_len, head_dim, generator=generator, device="cuda",
                        dtype=dtype)
    keys, values = dense_cache(batch, kv_heads, capacity, head_dim, dtype, starts, ends,
                               generator)
    cache_seqlens = None if lengths is None else torch.tensor(ends, dtype=torch.int32,
                                                              device="cuda")
    leftpad_tensor = torch.tensor(starts, dtype=torch.int32, device="cuda") if leftpad else None
    out, lse = attention_with_kvcache(query, keys, values, cache_seqlens,
                                      cache_leftpad=leftpad_tensor, is_causal=causal,
                                      num_splits=splits, return_lse=True)
    expected, expected_lse = reference(query, keys, values, starts, ends, causal and q_len > 1,
                                       1 / math.sqrt(head_dim))
    assert_close(out, lse, expected, expected_lse, dtype)


@pytest.mark.parametrize("block_size", [16, 32, 64, 256])  # 8, 4, 2 and 1 loads a key tile
@pytest.mark.parametrize("splits", [1, 4, None])
@pytest.mark.parametrize("q_len,causal", [(1, True), (4, True), (3, False), (8, True),
                                          (16, True), (32, True)])
def test_paged_cache_matches_the_reference(block_size, splits, q_len, causal):
    check_paged_cache(block_size, splits, q_len, causal, head_dim=128, ends=[1100, 0, 1, 517])


@pytest.mark.parametrize("block_size", [16, 32, 64, 256])
@pytest.mark.parametrize("splits", [1, 2])
def test_paged_cache_at_d64_on_one_wave_matches_the_reference(block_size, splits, monkeypatch):
    """32 columns at D=64, not padded to 64 (as with cache_leftpad), with splits of 2048
    keys and more: blocks of 256 take the one-wave launch's 256-key tiles
    (DecodeLaunch.one_wave_tiles), smaller ones the table's launch (one_wave_blocks)."""
    from cutile_fmha.steps import decode
    from cutile_fmha.steps.launcher import device_facts

    decode_launches = entry_for(device_facts(torch.device("cuda"))[0]).decode
    monkeypatch.setitem(decode_launches, 64,
                        dataclasses.replace(decode_launches[64], rows_padded_columns=None))
    monkeypatch.setattr(decode, "_PLANS", {})
    check_paged_cache(block_size, splits, 8, True, head_dim=64, ends=[4352, 0, 2049, 3001])


@pytest.mark.parametrize("block_size", [16, 32, 256])
def test_paged_cache_at_d64_refused_by_the_one_wave_launch_matches_the_reference(block_size):
    """16 columns at D=64 on a grid the one-wave launch would take: blocks of 256 take it,
    smaller ones the table's launch in twice the splits
    (DecodeLaunch.one_wave_refused_ctas_per_sm)."""
    check_paged_cache(block_size, None, 4, True, head_dim=64, ends=[8500, 0, 4097, 6001])


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("q_len", [16, 32])
def test_paged_cache_with_the_columns_on_m_matches_the_reference(head_dim, block_size, splits,
                                                                 q_len):
    """64 and 128 columns on a paged cache run on the products' M side, in tiles of part of
    a block or of several blocks: sequences that end inside a tile, on a tile but not a
    block boundary (640 in blocks of 256), on a block boundary inside a tile (1056 in
    blocks of 16 and 32) and on one (512), and of 0 and 1 keys, whose last blocks hold NaN
    past them."""
    check_paged_cache(block_size, splits, q_len, True, head_dim=head_dim,
                      ends=[1100, 0, 1, 517, 640, 512, 1056])


@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("q_len", [40, 300])
def test_paged_cache_with_a_chunk_past_one_ctas_columns_matches_the_reference(block_size,
                                                                             splits, q_len):
    """Chunked prefill on a paged cache: 160 and 512 columns in CTAs of 128, each reading
    the keys up to its own last row's."""
    check_paged_cache(block_size, splits, q_len, True, head_dim=128,
                      ends=[1100, 0, 1, 517, 640])


def check_paged_cache(block_size, splits, q_len, causal, head_dim, ends, value_dim=None):
    """A paged cache of sequences of `ends` keys (32/8 heads, bf16, shuffled blocks)
    against the float64 reference."""
    batch, heads, kv_heads, capacity = len(ends), 32, 8, max(ends)
    dtype = torch.bfloat16
    generator = torch.Generator(device="cuda").manual_seed(block_size + q_len)
    query = torch.randn(batch, heads, q_len, head_dim, generator=generator, device="cuda",
                        dtype=dtype)
    (keys, values), table, dense = paged_cache(batch, kv_heads, capacity, head_dim, dtype,
                                               block_size, ends, generator, value_dim)
    lengths = torch.tensor(ends, dtype=torch.int32, device="cuda")
    out, lse = attention_with_kvcache(query, keys, values, lengths, block_table=table,
                                      is_causal=causal, num_splits=splits, return_lse=True)
    assert out.shape == query.shape[:-1] + values.shape[-1:]
    expected, expected_lse = reference(query, *dense, [0] * batch, ends, causal,
                                       1 / math.sqrt(head_dim))
    assert_close(out, lse, expected, expected_lse, dtype)


# Head dims the decode kernel runs on padded tiles (80 and 96 on 128 columns, 192 on 256),
# and value head dims of their own (DeepSeek's 192/128).
PADDED_HEAD_DIMS = [(192, 128), (128, 64), (96, 96), (80, 80)]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("q_len,causal,leftpad,splits", [(1, True, False, None),
                                                         (4, True, True, 3),
                                                         (3, False, False, 1),
                                                         (16, True, False, 2)])
@pytest.mark.parametrize("head_dim,value_dim", PADDED_HEAD_DIMS)
def test_padded_and_value_head_dims_on_a_dense_cache(head_dim, value_dim, q_len, causal,
                                                     leftpad, splits, dtype):
    """Lengths 0 and one not a multiple of a tile, left padding, grouped heads, NaN
    outside each sequence, split and not."""
    dtype = DTYPES[dtype]
    batch, heads, kv_heads, capacity = 3, 16, 4, 500
    generator = torch.Generator(device="cuda").manual_seed(head_dim + q_len)
    ends = [500, 0, 77]
    starts = [min(e, 5 * b) for b, e in enumerate(ends)] if leftpad else [0] * batch
    query = torch.randn(batch, heads, q_len, head_dim, generator=generator, device="cuda",
                        dtype=dtype)
    keys, values = dense_cache(batch, kv_heads, capacity, head_dim, dtype, starts, ends,
                               generator, value_dim)
    lookup = {"cache_leftpad": torch.tensor(starts, dtype=torch.int32, device="cuda")} \
        if leftpad else {}
    out, lse = attention_with_kvcache(query, keys, values,
                                      torch.tensor(ends, dtype=torch.int32, device="cuda"),
                                      is_causal=causal, num_splits=splits, return_lse=True,
                                      **lookup)
    assert out.shape == (batch, heads, q_len, value_dim) and out.dtype == dtype
    expected, expected_lse = reference(query, keys, values, starts, ends, causal and q_len > 1,
                                       1 / math.sqrt(head_dim))
    assert_close(out, lse, expected, expected_lse, dtype)


@pytest.mark.parametrize("head_dim,value_dim", PADDED_HEAD_DIMS)
@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("q_len", [1, 16])
def test_padded_and_value_head_dims_on_a_paged_cache(head_dim, value_dim, block_size, splits,
                                                     q_len):
    check_paged_cache(block_size, splits, q_len, True, head_dim=head_dim,
                      ends=[1100, 0, 1, 517], value_dim=value_dim)


def assert_close(out, lse, expected, expected_lse, dtype):
    assert not out.isnan().any()
    error = (out.double() - expected).abs().max().item()
    assert error <= TOLERANCE[dtype] * max(expected.abs().max().item(), 1.0), error
    assert torch.equal(lse == -math.inf, expected_lse == -math.inf)
    seen = expected_lse > -math.inf
    assert (lse.double()[seen] - expected_lse[seen]).abs().max().item() < 1e-3 if seen.any() \
        else True


def test_a_cuda_graph_replays_a_call_with_new_lengths():
    generator = torch.Generator(device="cuda").manual_seed(5)
    query = torch.randn(2, 32, 1, 128, generator=generator, device="cuda", dtype=torch.bfloat16)
    keys, values = (torch.randn(2, 8, 2048, 128, generator=generator, device="cuda",
                                dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.tensor([2048, 100], dtype=torch.int32, device="cuda")
    attention_with_kvcache(query, keys, values, lengths)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_with_kvcache(query, keys, values, lengths)
    lengths.copy_(torch.tensor([3, 1500]))
    graph.replay()
    expected, _ = reference(query, keys, values, [0, 0], [3, 1500], False, 1 / math.sqrt(128))
    assert (out.double() - expected).abs().max().item() <= TOLERANCE[torch.bfloat16]


def test_torch_compile_runs_it_as_one_operator():
    query = torch.randn(2, 8, 1, 64, device="cuda", dtype=torch.float16)
    keys, values = (torch.randn(2, 2, 300, 64, device="cuda", dtype=torch.float16)
                    for _ in range(2))
    lengths = torch.tensor([300, 17], dtype=torch.int32, device="cuda")
    compiled = torch.compile(attention_with_kvcache, fullgraph=True)
    torch.testing.assert_close(compiled(query, keys, values, lengths),
                               attention_with_kvcache(query, keys, values, lengths))


def test_back_to_back_split_calls_each_merge_their_own_splits():
    # Calls on one stream reuse its split buffers: a merge that read a split of an earlier
    # call, or one not written yet, fails here.
    generator = torch.Generator(device="cuda").manual_seed(6)
    keys, values = (torch.randn(3, 4, 3000, 64, generator=generator, device="cuda",
                                dtype=torch.float16) for _ in range(2))
    for call in range(12):
        query = torch.randn(3, 16, 2, 64, generator=generator, device="cuda",
                            dtype=torch.float16)
        ends = torch.randint(0, 3001, (3,), generator=generator, device="cuda",
                             dtype=torch.int32)
        out, lse = attention_with_kvcache(query, keys, values, ends, num_splits=5 + call % 3,
                                          return_lse=True)
        expected, _ = reference(query, keys, values, [0] * 3, ends.tolist(), True, 0.125)
        assert (out.double() - expected).abs().max().item() <= TOLERANCE[torch.float16], call


def test_reduce_overhead_compile_replays_split_calls_in_cuda_graphs():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    generator = torch.Generator(device="cuda").manual_seed(7)
    keys, values = (torch.randn(2, 8, 2048, 128, generator=generator, device="cuda",
                                dtype=torch.bfloat16) for _ in range(2))
    compiled = torch.compile(attention_with_kvcache, mode="reduce-overhead", fullgraph=True)
    for call in range(5):  # warm-up, recording, then replays
        query = torch.randn(2, 32, 1, 128, generator=generator, device="cuda",
                            dtype=torch.bfloat16)
        ends = torch.randint(1, 2049, (2,), generator=generator, device="cuda",
                             dtype=torch.int32)
        out = compiled(query, keys, values, ends, num_splits=8).clone()
        expected, _ = reference(query, keys, values, [0, 0], ends.tolist(), False,
                                1 / math.sqrt(128))
        assert (out.double() - expected).abs().max().item() <= TOLERANCE[torch.bfloat16], call
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["cudagraph_skips"] == 0


@pytest.mark.parametrize("splits", [1, 4])
def test_a_call_keeps_none_of_its_tensors_alive(splits):
    from cutile_fmha import attention

    query = torch.randn(1, 8, 1, 64, device="cuda", dtype=torch.float16)
    keys, values = (torch.randn(1, 2, 1024, 64, device="cuda", dtype=torch.float16)
                    for _ in range(2))
    out = attention_with_kvcache(query, keys, values, num_splits=splits)
    dense = attention(query, keys, values, enable_gqa=True)
    refs = [weakref.ref(t) for t in (query, keys, values, out, dense)]
    del query, keys, values, out, dense
    gc.collect()
    assert all(ref() is None for ref in refs)


def reference_with_variants(query, keys, values, starts, ends, causal, scale, window_left,
                            softcap, sinks, window_right=None):
    """``reference`` with the variants: scores through softcap * tanh(scores / softcap),
    keys more than window_left before each row's diagonal (ends[b] - q_len + row) left
    out (and more than window_right past it, if given), and each head's sink in every row's
    softmax denominator."""
    batch, heads, q_len, _ = query.shape
    out = torch.zeros(query.shape[:-1] + values.shape[-1:], dtype=torch.float64,
                      device=query.device)
    lse = torch.zeros(query.shape[:-1], dtype=torch.float64, device=query.device)
    for b in range(batch):
        k, v = (t[b][:, starts[b]:ends[b]].double() for t in (keys, values))
        k, v = (t.repeat_interleave(heads // t.shape[0], 0) for t in (k, v))
        scores = query[b].double() @ k.transpose(-1, -2) * scale
        scores = softcap * torch.tanh(scores / softcap)
        key_index = torch.arange(starts[b], ends[b], device=query.device)[None, :]
        diagonal = ends[b] - q_len + torch.arange(q_len, device=query.device)[:, None]
        hidden = key_index < diagonal - window_left
        if causal:
            hidden |= key_index > diagonal
        if window_right is not None:
            hidden |= key_index > diagonal + window_right
        scores = scores.masked_fill(hidden, -math.inf)
        sink = sinks.double()[:, None, None].expand(heads, q_len, 1)
        lse[b] = torch.logsumexp(torch.cat([scores, sink], -1), -1)
        out[b] = torch.exp(scores - lse[b][..., None]) @ v
    return out, lse


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("splits", [1, 4, None])
@pytest.mark.parametrize("q_len,causal", [(1, True), (4, True), (3, False), (8, True),
                                          (16, True), (200, True), (100, False)])
def test_window_softcap_and_sinks_in_the_decode_kernel(paged, splits, q_len, causal):
    """The decode kernel with a window of 300 keys, softcap and sinks, dense (NaN outside
    each sequence, left padding) and paged (shuffled blocks), split or not, against
    float64: lengths 0, 1, shorter and longer than the window; 16 new tokens are 64
    columns, on a dense cache the products' M side, and 8 are 32, padded to 64 there; 200
    and 100 are tiles of 128 columns, each with its own rows' window."""
    check_variants(paged, splits, q_len, causal)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("splits", [1, None])
@pytest.mark.parametrize("q_len", [2, 16, 200])
@pytest.mark.parametrize("window_right", [0, 5, 40])
def test_a_window_bounded_on_the_right_without_a_causal_mask(paged, splits, q_len,
                                                             window_right):
    """Without is_causal, a window of 300 keys before each row's diagonal and window_right
    after it: the decode kernel's causal mask moved by window_right (steps/decode.py's
    ``kernel_window``), dense and paged, against float64."""
    check_variants(paged, splits, q_len, False, window_right=window_right)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("head_dim,value_dim", [(96, 96), (192, 128)])
@pytest.mark.parametrize("q_len", [1, 16, 200])
def test_window_softcap_and_sinks_at_padded_and_value_head_dims(paged, head_dim, value_dim,
                                                                q_len):
    check_variants(paged, None, q_len, True, head_dim, value_dim)


def check_variants(paged, splits, q_len, causal, head_dim=128, value_dim=None,
                   window_right=None):
    """A window of 300 keys (window_right after the diagonal where not causal: None,
    unbounded), softcap 10 and sinks against float64 (32/8 heads, bf16)."""
    batch, heads, kv_heads, capacity = 4, 32, 8, 1100
    dtype = torch.bfloat16
    generator = torch.Generator(device="cuda").manual_seed(q_len + 10 * paged)
    ends = [1100, 0, 1, 517]
    query = torch.randn(batch, heads, q_len, head_dim, generator=generator, device="cuda",
                        dtype=dtype) * 3
    sinks = torch.randn(heads, generator=generator, device="cuda")
    lengths = torch.tensor(ends, dtype=torch.int32, device="cuda")
    options = dict(is_causal=causal, num_splits=splits, return_lse=True, softcap=10.0,
                   sinks=sinks, window_size=(300, 0 if causal else
                                             -1 if window_right is None else window_right))
    if paged:
        starts = [0] * batch
        (keys, values), table, dense = paged_cache(batch, kv_heads, capacity, head_dim, dtype,
                                                   64, ends, generator, value_dim)
        out, lse = attention_with_kvcache(query, keys, values, lengths, block_table=table,
                                          **options)
    else:
        starts = [min(e, 7 * b) for b, e in enumerate(ends)]
        dense = dense_cache(batch, kv_heads, capacity, head_dim, dtype, starts, ends, generator,
                            value_dim)
        out, lse = attention_with_kvcache(query, *dense, lengths,
                                          cache_leftpad=torch.tensor(starts, dtype=torch.int32,
                                                                     device="cuda"), **options)
    expected, expected_lse = reference_with_variants(query, *dense, starts, ends, causal,
                                                     1 / math.sqrt(head_dim), 300, 10.0, sinks,
                                                     window_right)
    assert_close(out, lse, expected, expected_lse, dtype)


# head dim 96 on padded tiles
@pytest.mark.parametrize("cache,head_dim", [("dense", 128), ("dense", 96),
                                            ("dense, no lengths", 128), ("dense, no lengths", 96),
                                            ("paged, no block columns", 128),
                                            ("paged, no blocks", 128), ("paged, no blocks", 96)])
@pytest.mark.parametrize("q_len", [3, 32])  # 16 and 128 columns
def test_a_cache_with_room_for_no_keys(cache, head_dim, q_len):
    """A cache of capacity 0 (a dense one of no slots, a block table of no columns, or no
    blocks) gives zeros and an LSE of -inf, or the sink's logit with sinks, as a sequence
    of no keys in a larger cache does; at 128 columns a dense one runs them on the
    products' M side."""
    batch, heads, kv_heads = 2, 8, 2
    query = torch.randn(batch, heads, q_len, head_dim, device="cuda", dtype=torch.bfloat16)
    lengths = None if cache == "dense, no lengths" else \
        torch.zeros(batch, dtype=torch.int32, device="cuda")
    if cache.startswith("dense"):
        keys = torch.randn(batch, kv_heads, 0, head_dim, device="cuda", dtype=torch.bfloat16)
        options = {}
    else:
        blocks, columns = (4, 0) if cache == "paged, no block columns" else (0, 1)
        keys = torch.randn(blocks, 16, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
        options = {"block_table": torch.zeros(batch, columns, dtype=torch.int32, device="cuda")}
    sinks = torch.randn(heads, device="cuda")
    for with_sinks in (False, True):
        out, lse = attention_with_kvcache(query, keys, keys, lengths, return_lse=True,
                                          sinks=sinks if with_sinks else None, **options)
        assert torch.equal(out, torch.zeros_like(out))
        if with_sinks:
            torch.testing.assert_close(lse, sinks[None, :, None].expand_as(lse))
        else:
            assert torch.equal(lse, torch.full_like(lse, -math.inf))
