"""attention_with_kvcache's argument checks, and how it says so. No GPU: every check that
needs no look at a device tensor's values comes before the device check. Lengths past the
cache and block numbers outside it cannot be seen without one; the kernel clamps them
(tests/test_gpu_decode.py: garbage block table entries past a sequence's end)."""

import dataclasses
import functools

import pytest
import torch

from cutile_fmha import attention_with_kvcache
from cutile_fmha.platforms import DecodeLaunch, entry_for


def dense(batch=2, heads=8, kv_heads=2, q_len=1, head_dim=64, capacity=100,
          dtype=torch.float16):
    return (torch.randn(batch, heads, q_len, head_dim, dtype=dtype),
            torch.randn(batch, kv_heads, capacity, head_dim, dtype=dtype),
            torch.randn(batch, kv_heads, capacity, head_dim, dtype=dtype))


def lengths(values=(100, 3), dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


def paged(block_size=16, blocks=20, kv_heads=2, head_dim=64):
    query = torch.randn(2, 8, 1, head_dim, dtype=torch.float16)
    cache = [torch.randn(blocks, block_size, kv_heads, head_dim, dtype=torch.float16)
             for _ in range(2)]
    return query, *cache, torch.zeros(2, 4, dtype=torch.int32)


def test_importable_from_the_package_root():
    import cutile_fmha

    assert cutile_fmha.attention_with_kvcache is attention_with_kvcache
    assert "attention_with_kvcache" in cutile_fmha.__all__


def test_cpu_tensors_are_refused_last_with_the_device_named():
    with pytest.raises(ValueError, match="query must be on a CUDA device"):
        attention_with_kvcache(*dense(), lengths())


@pytest.mark.parametrize("change,error,message", [
    (lambda q, k, v: (q[0], k, v), ValueError, r"query must have 4 dimensions \(batch, heads"),
    (lambda q, k, v: (q.float(), k, v), TypeError, "query must be float16 or bfloat16"),
    (lambda q, k, v: (q, k.bfloat16(), v), TypeError, "must share one dtype: query is "
                                                      "torch.float16, key_cache is torch.bfloat16"),
    (lambda q, k, v: (q, k, v[:, :, :50]), ValueError, "key_cache and value_cache must have "
                                                       "one shape but for the head dim"),
    (lambda q, k, v: (q, k, v[..., :44]), ValueError, "value_cache's head dim must be a "
     "multiple of 8 up to 256, got 44"),
    (lambda q, k, v: (q, k.transpose(2, 3).contiguous().transpose(2, 3), v), ValueError,
     "key_cache's last dimension must be contiguous"),
    (lambda q, k, v: (q[..., :44], k[..., :44], v[..., :44]), ValueError,
     r"head dim \(last dimension of query\) must be a multiple of 8 up to 256, got 44"),
    (lambda q, k, v: (q[:, :7], k, v), ValueError, "multiple of the cache's"),
    (lambda q, k, v: (q[:1], k, v), ValueError, "key_cache must hold query's batch of 1"),
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "query must have at least one row"),
])
def test_tensors_are_checked(change, error, message):
    query, keys, values = change(*dense())
    with pytest.raises(error, match=message):
        attention_with_kvcache(query, keys, values, lengths())


@pytest.mark.parametrize("make,error,message", [
    (lambda: lengths(dtype=torch.int64), TypeError, "cache_seqlens must be int32"),
    (lambda: lengths((1, 2, 3)), ValueError, r"cache_seqlens must have a row per sequence, 2"),
    (lambda: lengths()[None], ValueError, r"cache_seqlens must have 1 dimensions \(batch,\)"),
    (lambda: [100, 3], TypeError, "cache_seqlens must be a torch.Tensor, got list"),
])
def test_cache_seqlens_is_checked(make, error, message):
    with pytest.raises(error, match=message):
        attention_with_kvcache(*dense(), make())


def test_cache_leftpad_needs_cache_seqlens_and_is_checked():
    with pytest.raises(ValueError, match="cache_leftpad needs cache_seqlens"):
        attention_with_kvcache(*dense(), cache_leftpad=lengths((0, 1)))
    with pytest.raises(TypeError, match="cache_leftpad must be int32"):
        attention_with_kvcache(*dense(), lengths(), cache_leftpad=lengths(dtype=torch.int64))


@pytest.mark.parametrize("options,error,message", [
    ({"num_splits": 0}, ValueError, "num_splits must be from 1 to 64"),
    ({"num_splits": 65}, ValueError, "num_splits must be from 1 to 64"),
    ({"num_splits": 2.0}, TypeError, "num_splits must be an int or None, got float"),
    ({"is_causal": 1}, TypeError, "is_causal must be a bool, got int"),
    ({"return_lse": None}, TypeError, "return_lse must be a bool"),
    ({"scale": -1.0}, ValueError, "scale must be a positive finite number"),
])
def test_options_are_checked(options, error, message):
    with pytest.raises(error, match=message):
        attention_with_kvcache(*dense(), lengths(), **options)


@pytest.mark.parametrize("head_dim,value_dim", [(192, 128), (96, 96), (80, 80), (128, 64)])
def test_padded_and_value_head_dims_take_dense_and_paged_caches(head_dim, value_dim):
    """Checked as far as a CPU can go, to the device, on both kinds of cache."""
    query, key_cache, value_cache, table = paged(head_dim=head_dim)
    with pytest.raises(ValueError, match="query must be on a CUDA device"):
        attention_with_kvcache(query, key_cache, value_cache[..., :value_dim], lengths(),
                               block_table=table)
    q, k, v = dense(head_dim=head_dim)
    with pytest.raises(ValueError, match="query must be on a CUDA device"):
        attention_with_kvcache(q, k, v[..., :value_dim], lengths())


@pytest.mark.parametrize("group,q_len,tiles,rows", [
    (4, 32, 1, 32), (4, 33, 2, 64), (8, 300, 32, 512), (1, 1000, 8, 1024), (16, 16, 2, 16),
    (32, 1, 1, 2)])
def test_more_columns_than_a_cta_holds_are_cut_into_tiles_of_128(group, q_len, tiles, rows):
    """A chunk of new tokens of any length: heads per K/V head x query rows, each a power
    of two, in CTAs of 128 columns; the grid's first dimension is tiles x splits."""
    from cutile_fmha.steps import decode

    launch = entry_for("sm_90").decode[128]
    shape = decode_shape(8192, group=group, q_len=q_len, causal=q_len > 1, num_splits=3)
    plan = decode.decode_plan(shape, launch, sms=132, device=None)
    assert (plan.constants["COLUMN_TILES"], plan.constants["QUERY_ROWS"]) == (tiles, rows)
    assert plan.grid == (3 * tiles, 8, 1)
    assert plan.split_buffer_shape[3] == plan.constants["GROUP_TILE"] * rows


def test_the_split_rule_counts_the_column_tiles_ctas():
    """32 tiles of 8 K/V heads fill 132 SMs unsplit; one tile of them is split."""
    from cutile_fmha.steps import decode

    launch = entry_for("sm_90").decode[128]
    assert decode.rule_splits(decode_shape(8192, group=8, q_len=300), launch, 132) == 1
    assert decode.rule_splits(decode_shape(8192, group=8, q_len=1), launch, 132) > 1


@pytest.mark.parametrize("head_dim,value_dim,tiles,launch", [
    (96, 96, (128, 128), 128), (80, 80, (128, 128), 128), (192, 128, (256, 128), 256),
    (128, 64, (128, 64), 128), (32, 32, (64, 64), 64), (72, 200, (128, 256), 256)])
def test_padded_head_dims_run_on_the_next_tile_width(head_dim, value_dim, tiles, launch):
    """Q's and K's, and V's, tiles are as wide as the next of 64, 128 and 256; the launch is
    the wider one's; the split buffers and the output have V's own head dim."""
    from cutile_fmha.steps import decode

    shape = dataclasses.replace(decode_shape(4096, num_splits=4), head_dim=head_dim,
                                value_head_dim=value_dim)
    assert shape.launch_head_dim == launch
    plan = decode.decode_plan(shape, entry_for("sm_90").decode[launch], sms=132, device=None)
    assert (plan.constants["TILE_D"], plan.constants["TILE_DV"]) == tiles
    assert plan.merge_constants["TILE_DV"] == tiles[1]
    assert plan.split_buffer_shape[-1] == value_dim


def test_a_paged_cache_needs_lengths_and_a_block_table_of_int32_rows_per_sequence():
    query, keys, values, table = paged()
    with pytest.raises(ValueError, match="a paged cache needs cache_seqlens"):
        attention_with_kvcache(query, keys, values, block_table=table)
    with pytest.raises(TypeError, match="block_table must be int32"):
        attention_with_kvcache(query, keys, values, lengths(), block_table=table.long())
    with pytest.raises(ValueError, match="block_table must have a row per sequence, 2"):
        attention_with_kvcache(query, keys, values, lengths(), block_table=table[:1])
    with pytest.raises(ValueError, match="query must be on a CUDA device"):
        attention_with_kvcache(query, keys, values, lengths(), block_table=table)


@pytest.mark.parametrize("block_size", [8, 24])
def test_paged_block_size_is_a_power_of_two_from_16(block_size):
    query, keys, values, table = paged(block_size)
    with pytest.raises(ValueError, match=f"block_size .* must be a power of two from 16 up, "
                                         f"got {block_size}"):
        attention_with_kvcache(query, keys, values, lengths(), block_table=table)


@pytest.mark.parametrize("ctas,keys,splits", [
    (8, 4096, 16),     # one sequence of 8 K/V heads: split up to one CTA per SM
    (8, 1024, 4),      # ... but no split shorter than min_keys_per_split
    (8, 768, 3),
    (8, 512, 1),       # ... nor of a cache of at most unsplit_keys
    (128, 32768, 1),   # batch x heads fill the SMs already
    (64, 32768, 2),
    (1, 1 << 20, 64),  # at most max_splits
])
def test_split_rule_fills_the_sms_without_short_splits(ctas, keys, splits):
    launch = DecodeLaunch(tile_n=128, occupancy=2, num_worker_warps=None, ctas_per_sm=1,
                          min_keys_per_split=256, max_splits=64)
    assert launch.splits(ctas, keys, sms=132) == splits


@pytest.mark.parametrize("group,q_len,batch,keys,tile_n,wide", [
    (4, 1, 16, 4096, 128, False), (4, 4, 16, 4096, 128, False),  # 8-16 columns
    (8, 2, 16, 4096, 128, False),
    (4, 32, 64, 4096, 128, True), (8, 16, 16, 512, 128, True),  # 128 columns
    (1, 128, 1, 4096, 128, True),
    (4, 8, 16, 4096, 64, True), (8, 4, 1, 32768, 64, True),  # 32 columns at one wave: 128 CTAs
    (4, 8, 16, 1024, 64, True),  # of 1024 keys and more, not 512
    (4, 8, 16, 512, 128, False), (4, 8, 1, 4096, 128, False),  # (16 splits of 256 keys)
    (4, 8, 32, 4096, 128, False), (8, 4, 17, 4096, 128, False),  # 256 and 136 CTAs
    (4, 16, 1, 32768, 128, True), (8, 8, 16, 4096, 128, True),  # 64 columns: own tiles
    (4, 16, 16, 512, 128, False), (4, 16, 32, 4096, 128, False),
])
def test_the_launch_by_columns_and_grid(group, q_len, batch, keys, tile_n, wide):
    """From wide_columns columns (heads of a K/V head x query rows) the decode kernel runs
    at the launch's wide occupancy and worker warps, below it at its own; from
    one_wave_columns columns too (at that many with tiles of one_wave_tiles[0] keys) while
    its grid is at most one CTA per SM and each split at least one_wave_keys keys."""
    launch = DecodeLaunch(tile_n=128, occupancy=2, num_worker_warps=None, ctas_per_sm=1,
                          min_keys_per_split=256, one_wave_columns=32, one_wave_tiles=(64,),
                          one_wave_keys=1024)
    assert_launch(launch, decode_shape(keys, group=group, q_len=q_len, batch=batch), tile_n,
                  wide)


@pytest.mark.parametrize("q_len,keys,block_size,tile_n,wide", [
    (8, 4096, None, 256, True), (16, 4096, None, 256, True),  # 32 and 64 columns
    (32, 4096, None, 128, True),  # 128 columns: the wide launch on tile_n
    (8, 1024, None, 128, False),  # splits shorter than one_wave_keys
    (8, 4096, 256, 256, True), (16, 4096, 512, 256, True),  # a block a tile
    (8, 4096, 64, 128, False), (8, 4096, 16, 128, False),  # not over 4 or 8 blocks
])
def test_the_one_wave_launch_takes_a_tile_per_column_count(q_len, keys, block_size, tile_n,
                                                           wide):
    """one_wave_tiles are the one-wave launch's tiles at one_wave_columns, twice as many,
    ..., wider than tile_n too (D=64's 256 keys); a paged cache takes it where a tile spans
    at most one_wave_blocks blocks, else the table's launch."""
    launch = DecodeLaunch(tile_n=128, occupancy=2, num_worker_warps=None, ctas_per_sm=1,
                          min_keys_per_split=256, one_wave_columns=32,
                          one_wave_tiles=(256, 256), one_wave_keys=2048, one_wave_blocks=1)
    assert_launch(launch, decode_shape(keys, head_dim=64, q_len=q_len, batch=16,
                                       block_size=block_size), tile_n, wide)


@pytest.mark.parametrize("batch,keys,q_len,block_size,has_starts,splits", [
    (16, 32768, 4, 16, False, 2), (8, 32768, 4, 32, False, 4),  # blocks refused: 2 a SM
    (1, 32768, 4, 16, False, 33),
    (1, 4096, 4, 16, False, 16),  # ... no split shorter than min_keys_per_split
    (16, 32768, 8, 16, True, 2),  # 32 columns, transposed with left padding
    (16, 32768, 4, 256, False, 1), (16, 32768, 4, None, False, 1),  # one wave takes them
    (16, 32768, 1, 16, False, 1),  # 8 columns: no one-wave launch
    (16, 4096, 4, 16, False, 2), (16, 1024, 4, 16, False, 1),  # splits under one_wave_keys
    (16, 32768, 16, 16, False, 1),  # 64 columns, on the M side
])
def test_paged_caches_the_one_wave_launch_refuses_split_further(batch, keys, q_len,
                                                                 block_size, has_starts,
                                                                 splits):
    """Where the one-wave launch would take the grid but not the paged cache's blocks
    (its tile would span more than one_wave_blocks), the rule splits to
    one_wave_refused_ctas_per_sm CTAs per SM."""
    from cutile_fmha.steps import decode

    launch = DecodeLaunch(tile_n=128, occupancy=2, num_worker_warps=None, ctas_per_sm=1,
                          min_keys_per_split=256, one_wave_columns=16,
                          one_wave_tiles=(256, 256, 256), one_wave_keys=2048,
                          one_wave_blocks=1, one_wave_refused_ctas_per_sm=2, rows_columns=64,
                          rows_block_size=16)
    shape = decode_shape(keys, head_dim=64, q_len=q_len, batch=batch, block_size=block_size,
                         has_starts=has_starts)
    assert decode.rule_splits(shape, launch, sms=132) == splits
    assert decode.decode_plan(shape, launch, sms=132, device=None).grid[0] == splits


@pytest.mark.parametrize("q_len,block_size,has_starts,rows,tile_n,wide", [
    (16, None, False, True, 128, False),  # 64 columns, dense: on the M side, own hints
    (32, None, True, True, 128, True),  # 128 columns: at the wide launch's
    (16, 64, False, True, 128, False),  # paged: at tile_n, two blocks a tile here
    (32, 256, False, True, 128, True), (32, 128, False, True, 128, True),
    (16, 32, False, False, 128, True), (32, 16, False, False, 128, True),  # blocks under 64
    (16, 64, True, False, 128, True),  # left padding in a paged cache: transposed
    (8, None, False, False, 64, True), (8, 256, False, False, 64, True),  # 32 columns
])
def test_caches_take_64_columns_and_more_on_the_products_m_side(q_len, block_size, has_starts,
                                                                rows, tile_n, wide):
    """From rows_columns columns a dense cache's plan puts the columns on the M side
    (QUERIES_ON_M) at tile_n and the launch's own hints below wide_columns, the wide ones
    from there, on one wave or not; so does a paged cache of blocks of rows_block_size
    keys and more, at tile_n too, unless its keys start per sequence; other paged caches
    keep the transposed products."""
    launch = DecodeLaunch(tile_n=128, occupancy=2, num_worker_warps=None, ctas_per_sm=1,
                          min_keys_per_split=256, one_wave_columns=32, one_wave_tiles=(64,),
                          one_wave_keys=1024, rows_columns=64, rows_block_size=64)
    shape = decode_shape(4096, q_len=q_len, batch=16, block_size=block_size,
                         has_starts=has_starts)
    assert_launch(launch, shape, tile_n, wide)
    from cutile_fmha.steps import decode
    assert decode.decode_plan(shape, launch, sms=132, device=None).constants["QUERIES_ON_M"] \
        is rows


@pytest.mark.parametrize("q_len,block_size,tile_n", [
    (32, 16, 64), (32, 32, 128), (32, 64, 128),  # 128 columns: at most 4 blocks a tile
    (32, None, 128),  # a dense cache: tile_n
    (16, 16, 128),  # 64 columns: tile_n, 8 blocks
])
def test_wide_paged_tiles_span_at_most_rows_wide_blocks(q_len, block_size, tile_n):
    """On the M side from wide_columns columns a paged cache's tiles span at most
    rows_wide_blocks blocks; below, and in a dense cache, they are tile_n keys."""
    launch = DecodeLaunch(tile_n=128, occupancy=2, num_worker_warps=None, ctas_per_sm=1,
                          min_keys_per_split=256, rows_columns=64, rows_block_size=16,
                          rows_wide_blocks=4)
    assert_launch(launch, decode_shape(4096, q_len=q_len, batch=16, block_size=block_size),
                  tile_n, q_len == 32)


@pytest.mark.parametrize("group,q_len,block_size,has_starts,query_rows", [
    (4, 8, None, False, 16), (8, 4, 16, False, 8), (1, 32, 64, False, 64),  # 32 columns: 64
    (4, 5, None, True, 16),  # left padding in a dense cache: still its own keys
    (4, 8, 16, True, 8),  # left padding in a paged cache: transposed, not padded
    (4, 8, 8, False, 8),  # blocks under rows_block_size: transposed, not padded
    (4, 4, None, False, 4), (4, 16, None, False, 16),  # 16 columns, and 64 as they are
])
def test_32_columns_are_padded_to_64_where_64_run_on_the_m_side(group, q_len, block_size,
                                                                has_starts, query_rows):
    """From rows_padded_columns columns up to rows_columns a plan pads its query rows to
    rows_columns columns where those run on the M side; elsewhere it keeps them."""
    from cutile_fmha.steps import decode

    launch = DecodeLaunch(tile_n=128, occupancy=2, num_worker_warps=None, ctas_per_sm=1,
                          min_keys_per_split=256, one_wave_columns=32, one_wave_tiles=(64,),
                          one_wave_keys=1024, rows_columns=64, rows_block_size=16,
                          rows_padded_columns=32)
    shape = decode_shape(4096, group=group, q_len=q_len, batch=16, block_size=block_size,
                         has_starts=has_starts)
    constants = decode.decode_plan(shape, launch, sms=132, device=None).constants
    assert constants["QUERY_ROWS"] == query_rows
    assert constants["QUERIES_ON_M"] is (group * query_rows >= 64)


@pytest.mark.parametrize("head_dim,tail", [
    (64, 0), (128, 0), (256, 0),  # whole tiles: one load
    (72, 8), (80, 16), (96, 32), (40, 8), (48, 16), (136, 8), (160, 32), (192, 64),
    (112, 0), (56, 0), (200, 0), (32, 0),  # a rest past a quarter of the tile, or none
])
def test_keys_below_their_tiles_width_load_in_two_pieces(head_dim, tail):
    """loaded_tail: the second of K's two loads covers the head dim's rest past half its
    tile, a power of two of at least 8 columns, where that rest is at most a quarter."""
    from cutile_fmha.steps.decode import loaded_tail

    assert loaded_tail(head_dim) == tail


@pytest.mark.parametrize("q_len,block_size,has_starts,tail", [
    (1, None, False, 16), (1, 64, False, 16), (1, 256, True, 16),  # transposed products
    (1, 16, False, 0), (1, 32, False, 0),  # blocks under 64 keys: one load
    (16, None, False, 0), (16, 64, False, 0),  # 64 columns on the M side: step 9's loads
])
def test_the_transposed_products_take_keys_in_pieces_from_blocks_of_64(q_len, block_size,
                                                                       has_starts, tail):
    """The decode plan's D_TAIL (D=80): K in two loads on a dense cache or in blocks of 64
    keys and more, where the products are transposed; one load in smaller blocks and on
    the M side."""
    from cutile_fmha.steps import decode

    launch = entry_for("sm_90").decode[128]
    shape = decode_shape(4096, head_dim=80, q_len=q_len, batch=16, block_size=block_size,
                         has_starts=has_starts)
    assert decode.decode_plan(shape, launch, sms=132, device=None).constants["D_TAIL"] == tail


def assert_launch(launch, shape, tile_n: int, wide: bool) -> None:
    """`launch`'s plan of `shape` (on 132 SMs) has tiles of `tile_n` keys, at the wide
    launch's hints or, where not `wide`, at its own."""
    from cutile_fmha.kernels import decode as kernels
    from cutile_fmha.steps import decode
    from cutile_fmha.steps.launcher import with_hints

    plan = decode.decode_plan(shape, launch, sms=132, device=None)
    hints = {"occupancy": 1, "num_worker_warps": 8} if wide else \
        {"occupancy": 2, "num_worker_warps": None}
    assert plan.kernel is with_hints(kernels.decode, hints)
    assert plan.constants["TILE_N"] == tile_n


def test_buffers_are_kept_only_outside_a_cuda_graphs_memory_pool(monkeypatch):
    from cutile_fmha.steps.decode import kept

    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    made, cache = [], {}

    def make():
        made.append(object())
        return made[-1]

    inside_operator = kept(cache, "stream", make, keep=False)  # torch.compile's graphs
    capturing[0] = True
    while_capturing = kept(cache, "stream", make, keep=True)
    assert not cache and inside_operator is not while_capturing
    capturing[0] = False
    first = kept(cache, "stream", make, keep=True)
    assert cache == {"stream": first}
    assert kept(cache, "stream", make, keep=False) is first  # kept outside any pool: shared
    assert len(made) == 3


@pytest.mark.parametrize("capability,early", [((8, 0), False), ((8, 9), False),
                                               ((9, 0), True), ((12, 0), True)])
def test_the_merge_launches_programmatically_from_hopper_on(capability, early, monkeypatch):
    """Programmatic dependent launches exist from sm_90: the merge waits on the GPU there
    (kernels/decode.py); before it, a plain launch after the splits."""
    from cutile_fmha.steps import decode

    fresh_plans(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    plan = decode._cached_plan(decode_shape(4096), torch.device("cuda", 0), None)
    assert plan.split_buffer_shape is not None  # split: a merge to launch
    assert plan.early_merge is early


def fresh_plans(monkeypatch):
    """The decode plans made from here on are the test's own (an sm_90 with 132 SMs)."""
    from cutile_fmha.steps import decode

    monkeypatch.setattr(decode, "device_facts", lambda device: ("sm_90", 132))
    monkeypatch.setattr(decode, "_PLANS", {})
    monkeypatch.setattr(decode, "_plan_of_splits", decode._plan_of_splits.__wrapped__)


def decode_shape(capacity: int, **changes):
    from cutile_fmha.steps import decode

    return decode.DecodeShape(**{"batch": 1, "head_dim": 128, "kv_heads": 8, "group": 4,
                                 "q_len": 1, "capacity": capacity, "block_size": None,
                                 "causal": True, "has_starts": False, "has_lengths": True,
                                 "write_lse": False, "num_splits": None, **changes})


def test_a_growing_cache_shares_one_plan_per_split_count(monkeypatch):
    """A DynamicCache is one key longer at each decoding step: its lengths share the plan
    (and split buffers) of their split count, not one new plan per step."""
    from cutile_fmha.steps import decode

    fresh_plans(monkeypatch)
    monkeypatch.setattr(decode, "_plan_of_splits", functools.cache(decode._plan_of_splits))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    device = torch.device("cuda", 0)
    plans = [decode._cached_plan(decode_shape(n), device, None) for n in (4096, 4097, 4352)]
    assert plans[0] is plans[1] is plans[2]
    assert decode._cached_plan(decode_shape(4096), device, None) is plans[0]
    short = decode._cached_plan(decode_shape(1024), device, None)  # fewer splits: its own
    assert short.split_buffer_shape[2] < plans[0].split_buffer_shape[2]
    assert decode._cached_plan(decode_shape(4096, num_splits=16), device, None) is plans[0]
    # at 32 columns left transposed, one plan each side of the one-wave launch's 16 x 1024
    # keys (D=128)
    transposed = dataclasses.replace(entry_for("sm_90").decode[128], rows_padded_columns=None)
    wide = [decode._cached_plan(decode_shape(n, q_len=8), device, transposed)
            for n in (4096, 16383, 16384, 20000)]
    assert wide[0] is wide[1] and wide[2] is wide[3]
    assert [plan.constants["TILE_N"] for plan in wide] == [128, 128, 64, 64]


@pytest.mark.parametrize("causal,q_len,window,expected", [
    (False, 4, (7, 3), (True, 10, 3)),          # the diagonal moved 3 keys on
    (False, 4, (None, 3), (True, 2 ** 30, 3)),  # unbounded on the left stays so
    (False, 4, (7, None), (False, 7, 0)),       # unbounded on the right: no causal mask
    (False, 1, (7, 3), (False, 7, 0)),          # one row sees every key to the last
    (True, 4, (7, 0), (True, 7, 0)),
    (False, 4, None, (False, None, 0))])
def test_a_window_bounded_on_the_right_runs_as_a_moved_causal_mask(causal, q_len, window,
                                                                   expected):
    """The decode kernel's window has the causal mask's right side: a window bounded on the
    right without one runs as a causal mask whose diagonal moves by the right side, the
    left side counted from the moved diagonal."""
    from cutile_fmha.steps import decode
    from cutile_fmha.steps.variants import Variants

    variants = None if window is None else Variants(window=window)
    kernel_causal, scalars = decode.kernel_window(
        decode_shape(4096, q_len=q_len, causal=causal, variants=variants))
    left = scalars["window_left"] if window is not None else None
    assert (kernel_causal, left, scalars["window_right"]) == expected


def test_a_window_bounded_on_the_right_reaches_the_device_check_on_a_paged_cache():
    query, k, v, table = paged(head_dim=64)
    with pytest.raises(ValueError, match="query must be on a CUDA device"):
        attention_with_kvcache(query.expand(-1, -1, 2, -1), k, v, lengths(), block_table=table,
                               is_causal=False, window_size=(8, 8))


def test_variants_on_a_paged_cache_reach_the_device_check():
    """The decode kernel takes the variants on a paged cache: on the CPU, only the device
    check stops it."""
    query, k, v, table = paged()
    with pytest.raises(ValueError, match="query must be on a CUDA device"):
        attention_with_kvcache(query, k, v, lengths(), block_table=table, softcap=30.0,
                               window_size=(64, 0), sinks=torch.zeros(8))


@pytest.mark.parametrize("options", [{}, {"softcap": 30.0, "window_size": (64, 0)}])
def test_a_compiled_call_is_one_operator_with_or_without_the_variants(options, monkeypatch):
    """torch.compile(fullgraph=True) traces the checks into one decode operator, which gets
    the variants (its launch replaced, and the device check skipped, to run on the CPU)."""
    import cutile_fmha.kvcache as kvcache

    shapes = []

    def decode_forward(query, key_cache, value_cache, shape, **_):
        shapes.append(shape)
        return torch.zeros_like(query), None

    monkeypatch.setattr(kvcache, "_check_devices", lambda named: None)
    monkeypatch.setattr(kvcache, "decode_forward", decode_forward)
    sinks = torch.zeros(8) if options else None
    compiled = torch.compile(lambda *tensors: attention_with_kvcache(*tensors, sinks=sinks,
                                                                     **options),
                             fullgraph=True, backend="aot_eager")
    query, keys, values = dense()
    assert compiled(query, keys, values, lengths()).shape == query.shape
    variants = shapes[-1].asked
    assert (variants.softcap, variants.window, variants.sinks) == \
        ((30.0, (64, 0), True) if options else (None, None, False))


def test_a_compiled_call_gets_the_value_head_dim(monkeypatch):
    """Under torch.compile the decode operator's output has value_cache's head dim (its
    fake), and the shape it runs carries it (launch replaced, device check skipped)."""
    import cutile_fmha.kvcache as kvcache

    shapes = []

    def decode_forward(query, key_cache, value_cache, shape, **_):
        shapes.append(shape)
        return query.new_zeros(*query.shape[:-1], value_cache.shape[-1]), None

    monkeypatch.setattr(kvcache, "_check_devices", lambda named: None)
    monkeypatch.setattr(kvcache, "decode_forward", decode_forward)
    compiled = torch.compile(attention_with_kvcache, fullgraph=True, backend="aot_eager")
    query, keys, values = dense(head_dim=96)
    assert compiled(query, keys, values[..., :32].contiguous(), lengths()).shape == \
        query.shape[:-1] + (32,)
    assert (shapes[-1].head_dim, shapes[-1].value_dim) == (96, 32)


@pytest.mark.parametrize("compiled", [False, True])
def test_an_empty_batch_launches_nothing(compiled, monkeypatch):
    """No sequence: zeros of value_cache's head dim and an LSE, no plan nor launch (whose
    split rule has no CTAs to count), eager and under torch.compile alike (the device
    check skipped, to run on the CPU; a launch would fail here)."""
    import cutile_fmha.kvcache as kvcache

    monkeypatch.setattr(kvcache, "_check_devices", lambda named: None)
    call = functools.partial(attention_with_kvcache, num_splits=None, return_lse=True)
    if compiled:
        call = torch.compile(call, fullgraph=True, backend="aot_eager")
    query, keys, values = dense(batch=0, head_dim=96)
    out, lse = call(query, keys, values[..., :32].contiguous(), lengths(()))
    assert out.shape == (0, 8, 1, 32) and lse.shape == (0, 8, 1)


def test_the_variants_are_checked_once_per_shape_key(monkeypatch):
    """A decoding step calls this per layer and token: the variants' checks run on the
    first call of a shape key only (its launch replaced, and the device check skipped, to
    run on the CPU); other variants make another key."""
    import cutile_fmha.kvcache as kvcache

    checks, shapes = [], []
    check_variants = kvcache._check_variants
    monkeypatch.setattr(kvcache, "_check_variants",
                        lambda *args: checks.append(1) or check_variants(*args))
    monkeypatch.setattr(kvcache, "_check_devices", lambda named: None)
    monkeypatch.setattr(kvcache, "decode_forward",
                        lambda query, *args, **_: shapes.append(args[2]) or (query, None))
    query, keys, values = dense()
    sinks = torch.zeros(8)
    for softcap in (30.0, 30.0, 30.0, 20.0):
        attention_with_kvcache(query, keys, values, lengths(), softcap=softcap, sinks=sinks,
                               window_size=(64, 0))
    assert len(checks) == 2
    assert [shape.asked.softcap for shape in shapes] == [30.0, 30.0, 30.0, 20.0]
