"""Every input the launcher refuses, and how it says so. Runs without a GPU: shape and
dtype checks come before the device check."""

import re

import pytest
import torch

import cutile_fmha
from cutile_fmha.steps import STEPS, attention, backward, launcher, plan_launch, variants
from cutile_fmha.steps.launcher import split_head_dim, tile_head_dim
from cutile_fmha.platforms.environment import CHECK_COMMAND


def qkv(shape=(2, 3, 40, 64), k_len=None, dtype=torch.float16):
    b, h, n, d = shape
    k_shape = (b, h, k_len or n, d)
    return torch.randn(shape, dtype=dtype), torch.randn(k_shape, dtype=dtype), \
        torch.randn(k_shape, dtype=dtype)


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got ndarray"):
        attention(q, k.numpy(), v)


def test_wrong_rank():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"v must have 4 dimensions .* got shape \(3, 40, 64\)"):
        attention(q, k, v[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_unsupported_dtype(dtype):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=f"q must be float16 or bfloat16, got {dtype}"):
        attention(q.to(dtype), k, v)


def test_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="share one dtype: q is torch.float16, v is torch.bfloat16"):
        attention(q, k, v.bfloat16())


@pytest.mark.parametrize("dim,what", [(0, "batch size"), (3, "head dim")])
def test_mismatched_dimension(dim, what):
    q, k, v = qkv()
    shape = list(k.shape)
    shape[dim] += 1 if dim != 3 else 64
    with pytest.raises(ValueError, match=f"k must match q's {what}"):
        attention(q, torch.randn(shape, dtype=q.dtype), v)


@pytest.mark.parametrize("v_slice", [(slice(None), slice(None), slice(0, 39)),
                                     (slice(None), slice(0, 1))], ids=["length", "heads"])
def test_key_value_mismatch(v_slice):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k and v must have the same heads and sequence length, "
                                         r"got shapes \(2, 3, 40, 64\) and"):
        attention(q, k, v[v_slice])


def test_query_heads_must_be_a_multiple_of_key_value_heads():
    q, k, v = qkv((2, 6, 40, 64))
    with pytest.raises(ValueError, match=r"q's head count must be a multiple of k's and v's "
                                         r"\(grouped-query attention\), got 6 and 4"):
        attention(q, k[:, :4], v[:, :4])


@pytest.mark.parametrize("head_dim", [32, 96, 832, 1088])
def test_unsupported_head_dim(head_dim):
    q, k, v = qkv((1, 1, 8, head_dim))
    with pytest.raises(ValueError, match=rf"head dim .* must be one of \(64, 128, 256, 320, .*, "
                                         rf"1024\), got {head_dim}"):
        attention(q, k, v)


def test_empty_sequence():
    q, k, v = qkv((1, 2, 8, 64), k_len=1)
    with pytest.raises(ValueError, match="sequence lengths must be at least 1"):
        attention(q, k[:, :, :0], v[:, :, :0])


def test_last_dimension_not_contiguous():
    q, k, v = qkv()
    k_strided = torch.randn(2, 3, 64, 40, dtype=q.dtype).transpose(2, 3)
    with pytest.raises(ValueError, match=r"k's last dimension must be contiguous .* k.contiguous\(\)"):
        attention(q, k_strided, v)


def test_causal_must_be_bool_or_an_alignment():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="causal must be a bool or one of .* got int"):
        attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match=r"causal must be False, True or one of \('top_left', "
                                         r"'bottom_right'\), got 'lower_right'"):
        attention(q, k, v, causal="lower_right")


def test_with_lse_must_be_bool():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="with_lse must be a bool, got int"):
        plan_launch(q, k, v, with_lse=1)


@pytest.mark.parametrize("scale,error", [(0.0, ValueError), (-0.1, ValueError),
                                         (float("nan"), ValueError), ("0.1", TypeError)])
def test_bad_scale(scale, error):
    q, k, v = qkv()
    with pytest.raises(error, match="scale must be"):
        attention(q, k, v, scale=scale)


@pytest.mark.parametrize("step", [0, max(STEPS) + 1])
def test_unknown_step(step):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=rf"step must be one of \{sorted(STEPS)}\ or 'fastest', "
                                         rf"got {step!r}"):
        attention(q, k, v, step=step)


@pytest.mark.parametrize("step,head_dim,steps_there", [(9, 512, [10, 11]),
                                                       (10, 128, [1, 2, 3, 4, 5, 6, 7, 8, 9])])
def test_step_that_does_not_run_the_head_dim(step, head_dim, steps_there):
    q, k, v = qkv((1, 2, 8, head_dim))
    with pytest.raises(ValueError, match=rf"step {step} runs head dims .*; at head dim "
                                         rf"{head_dim} the steps are {re.escape(str(steps_there))}"):
        attention(q, k, v, step=step)


@pytest.mark.parametrize("step", [True, 1.0, "6", None])
def test_step_that_is_not_an_int(step):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=f"step must be an int, .* got {type(step).__name__}"):
        attention(q, k, v, step=step)


def test_unknown_platform():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="platform must be one of .*'sm_90'.* got 'sm_75'"):
        attention(q, k, v, platform="sm_75")


def test_out_of_the_wrong_shape():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="out must have q's shape and dtype"):
        attention(q, k, v, out=torch.empty_like(q)[:, :, :10])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cpu_tensors_without_a_gpu_point_to_the_environment_check():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=f"q must be on a CUDA device, got cpu; no CUDA GPU is "
                                         f"visible here \\(check with: {CHECK_COMMAND}\\)"):
        attention(q, k, v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tensors_on_cpu_and_gpu():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="v must be on a CUDA device, got cpu"):
        attention(q.cuda(), k.cuda(), v)


def test_on_device_makes_a_launch_once_per_architecture_and_shape(monkeypatch):
    monkeypatch.setattr(launcher, "device_facts", lambda device: ("sm_90", 132))
    made = []

    def make(entry, *, head_dim, causal):
        made.append((entry.arch, head_dim, causal))
        return object()

    first = launcher.on_device(make, torch.device("cpu"), head_dim=128, causal=True)
    assert launcher.on_device(make, torch.device("cpu"), head_dim=128, causal=True) is first
    launcher.on_device(make, torch.device("cpu"), head_dim=64, causal=True)
    assert made == [("sm_90", 128, True), ("sm_90", 64, True)]


def test_tensors_past_32_bit_strides():
    """cuTile takes 32-bit strides: a sequence whose heads x length x head dim passes 2^31
    elements per batch entry (the outputs made for it would) where no group of its heads
    fits either (one head of 2^31 elements; 2^20 rows of 32 heads in (batch, seq, heads,
    D) memory, where every head spans the whole), or a view with a larger stride, is
    refused by name (meta tensors: no memory needed), by the variants' kernel too."""
    one_head = torch.empty(1, 1, 2 ** 24, 128, dtype=torch.float16, device="meta")
    by_rows = torch.empty(1, 2 ** 20, 32, 128, dtype=torch.float16, device="meta").transpose(1, 2)
    for long in (one_head, by_rows):
        for variant in ({}, {"softcap": 30.0}):
            with pytest.raises(ValueError, match=r"query is too long for the kernels' 32-bit "
                                                 r"strides.*ring_attention"):
                cutile_fmha.attention(long, long, long, is_causal=True, **variant)
    q = torch.empty(2, 2, 8, 64, dtype=torch.float16, device="meta")
    strided = torch.empty(0, dtype=torch.float16, device="meta").as_strided(
        (2, 2, 8, 64), (2 ** 31, 512, 64, 1))
    with pytest.raises(ValueError, match=r"k is too long .* \(strides \(2147483648, 512, 64, 1\)"):
        attention(q, strided, q)


@pytest.mark.parametrize("head_dim,tiles", [
    (96, (64, 32)), (80, (64, 16)), (160, (128, 32)), (144, (128, 16)), (192, (128, 64)),
    (64, (64, 0)), (128, (128, 0)), (256, (256, 0)),  # powers of two: one tile
    (72, (128, 0)), (112, (128, 0)), (224, (256, 0)),  # no power-of-two tail of 16 or more
    (320, (320, 0)),  # past D=256 steps 10-11 tile the head dim themselves
])
def test_q_and_k_columns_split_in_two_power_of_two_tiles_where_they_cover_the_head_dim(
        head_dim, tiles):
    assert split_head_dim(head_dim) == tiles
    main, tail = tiles
    assert main + tail == head_dim or (tail == 0 and main == tile_head_dim(head_dim))


@pytest.mark.parametrize("shapes,per_launch", [
    (((1, 32, 2 ** 19, 128),) * 3, 16),                  # 2^31 elements: two launches
    (((1, 32, 2 ** 19, 128), (1, 8, 2 ** 19, 128), (1, 8, 2 ** 19, 128)), 4),  # 4 query heads each
    (((1, 6, 2 ** 22, 128),) * 3, 3),                    # 3 x 2^29: the largest divisor
    (((4, 32, 2 ** 16, 128),) * 3, None),                # 2^28 a batch entry: fits whole
    (((1, 1, 2 ** 24, 128),) * 3, None),                 # one head of 2^31: no group fits
])
def test_heads_past_32_bit_strides_run_in_the_largest_groups_that_fit(shapes, per_launch):
    q, k, v = (torch.empty(shape, dtype=torch.bfloat16, device="meta") for shape in shapes)
    assert launcher.kv_heads_per_launch(q, k, v) == per_launch


def test_a_view_whose_batch_stride_passes_32_bits_runs_whole_on_a_restrided_view():
    """Half the heads of a (1, 64, 2^18, 128) tensor fit 32-bit offsets, but keep its batch
    stride of 2^31, which cuTile refuses though the dimension has size 1: one launch of all
    32 heads, on a view whose size-1 dimensions are strided as if packed."""
    q = torch.empty(1, 64, 2 ** 18, 128, dtype=torch.bfloat16, device="meta")[:, :32]
    assert q.stride()[0] == 2 ** 31
    assert launcher.kv_heads_per_launch(q, q, q) == 32
    rows, _ = next(launcher.head_groups(1, 32, 1, 32))
    view = launcher.head_group_view(q, rows)
    assert view.shape == q.shape and view.stride() == (2 ** 30, 2 ** 25, 128, 1)


@pytest.mark.parametrize("rows,keys,causal", [  # a ring step's views of 2^31-element shards
    (slice(None), slice(None), True), (slice(2 ** 18, None), slice(None), False),
    (slice(None), slice(0, 2 ** 18), False)])
def test_views_of_tensors_past_32_bits_launch_with_32_bit_strides(monkeypatch, rows, keys,
                                                                   causal):
    """Sequence slices of (1, 32, 2^19, 128) tensors, as ring_attention's steps take them:
    the forward's and the backward's launches (stubbed; meta tensors) see no stride past 32
    bits, size-1 dimensions included."""
    strides = []

    def launch(stream, grid, kernel, args):
        strides.extend(t.stride() for t in args if isinstance(t, torch.Tensor))

    class Plan:
        def launch_on(self, q, k, v, out, lse):
            launch(None, None, None, (q, k, v, out, lse))

    monkeypatch.setattr(backward.ct, "launch", launch)
    monkeypatch.setattr(backward, "device_facts", lambda device: ("sm_90", 132))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    q, k, v, out, grad_out = (torch.empty(1, 32, 2 ** 19, 128, dtype=torch.bfloat16,
                                          device="meta") for _ in range(5))
    lse = torch.empty(1, 32, 2 ** 19, device="meta")
    q, out, grad_out, lse = (t[:, :, rows] for t in (q, out, grad_out, lse))
    k, v = k[:, :, keys], v[:, :, keys]
    launcher.HeadGroupLaunches(Plan(), launcher.kv_heads_per_launch(q, k, v)).launch_on(
        q, k, v, out, lse)
    backward.attention_backward(q, k, v, out, lse.contiguous(), grad_out, causal=causal)
    assert strides and max(max(s) for s in strides) <= launcher.MAX_STRIDE


def test_variants_past_32_bits_launch_per_group_of_heads_with_their_sinks(monkeypatch):
    """The variants' kernel (softcap, window and sinks, D=96 on split columns) on a query
    of 96 heads x 2^18 rows, 4 to a K/V head (1.125 x 2^31 elements: past 32-bit strides):
    two launches of 12 K/V heads and their 48 query heads (stubbed; meta tensors), each on
    its heads' rows of q, out and the LSE, of k and v, and of the sinks, no stride past
    32 bits."""
    launched = []

    def launch(stream, grid, kernel, args):
        launched.append((grid, [t for t in args if isinstance(t, torch.Tensor)]))

    monkeypatch.setattr(variants.ct, "launch", launch)
    monkeypatch.setattr(variants, "current_stream", lambda device: None)
    monkeypatch.setattr(launcher, "device_facts", lambda device: ("sm_90", 132))
    rows = 2 ** 18
    q = torch.empty(1, 96, rows, 96, dtype=torch.bfloat16, device="meta")
    k, v = (torch.empty(1, 24, rows, 96, dtype=torch.bfloat16, device="meta") for _ in range(2))
    sinks = torch.empty(96, device="meta")
    per_launch = launcher.kv_heads_per_launch(q, k, v)
    assert per_launch == 12
    out, lse = variants.variants_forward(
        q, k, v, query_offset=0, scale=0.1, with_lse=True, sinks=sinks,
        variants=variants.Variants(window=(1024, 0), softcap=30.0, sinks=True),
        kv_heads_per_launch=per_launch)
    assert len(launched) == 2
    for group, (grid, (q_view, k_view, v_view, out_view, lse_view, sinks_view)) in \
            enumerate(launched):
        assert grid[1:] == (48, 1)
        assert max(max(t.stride()) for t in (q_view, k_view, v_view, out_view, lse_view)) \
            <= launcher.MAX_STRIDE
        assert [t.storage_offset() for t in (q_view, out_view, lse_view, k_view, v_view)] == \
            [group * 48 * rows * 96] * 2 + [group * 48 * rows] + [group * 12 * rows * 96] * 2
        assert sinks_view.shape == (48,) and sinks_view.storage_offset() == group * 48


def test_head_group_launches_run_one_plan_on_each_groups_views():
    """Per batch entry and group of K/V heads, the plan's launch on views of the query
    heads that read them (their rows of out and the LSE too) and of those K/V heads, each
    with the group's own batch stride (cuTile refuses the whole tensor's past 32 bits)."""
    launched = []

    class Plan:
        def launch_on(self, q, k, v, out, lse):
            assert all(t.stride()[0] == t[0].numel() for t in (q, k, v, out, lse))
            launched.append(tuple((t.storage_offset(), tuple(t.shape))
                                  for t in (q, k, v, out, lse)))

    q = torch.empty(2, 8, 3, 4)
    k = torch.empty(2, 4, 5, 4)
    lse = torch.empty(2, 8, 3)
    launcher.HeadGroupLaunches(Plan(), 2).launch_on(q, k, k, torch.empty_like(q), lse)
    query_side, key_side, lse_side = (1, 4, 3, 4), (1, 2, 5, 4), (1, 4, 3)
    assert launched == [
        ((batch * 96 + half * 48, query_side), (batch * 80 + half * 40, key_side),
         (batch * 80 + half * 40, key_side), (batch * 96 + half * 48, query_side),
         (batch * 24 + half * 12, lse_side))
        for batch in range(2) for half in range(2)]
