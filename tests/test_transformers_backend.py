"""The transformers attention backend: registration, masks, and a small Llama on the CPU
with the kernels replaced by the reference (the kernels themselves are checked on the GPU
in test_gpu_correctness.py and test_gpu_backward.py)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from cutile_fmha import transformers_backend as backend  # noqa: E402

SDPA_NAME = "sdpa"


def test_registers_under_its_own_name_and_never_replaces_transformers_own():
    from transformers import AttentionInterface

    assert backend.register() == "cutile_fmha"
    assert AttentionInterface()["cutile_fmha"] is backend.attention_forward
    for name in ("sdpa", "eager"):
        with pytest.raises(ValueError, match=f"name '{name}' is one of transformers' own"):
            backend.register(name)
    assert AttentionInterface()["sdpa"] is not backend.attention_forward


def test_the_mask_it_registers_hands_over_padding_only():
    from transformers.masking_utils import causal_mask_function

    ones = torch.ones(2, 6, dtype=torch.bool)
    assert backend.padding_mask(2, 6, 6, mask_function=causal_mask_function,
                                attention_mask=ones) is None
    assert backend.padding_mask(2, 6, 6, mask_function=causal_mask_function) is None
    left = ones.clone()
    left[1, :2] = False
    assert torch.equal(backend.padding_mask(2, 6, 6, mask_function=causal_mask_function,
                                            attention_mask=left.long()), left)
    # A StaticCache: the mask is shorter than the cache, which it bounds even unpadded; at
    # a decoding step, as a key mask over the whole cache (the same shape every step).
    assert torch.equal(backend.padding_mask(2, 6, 9, mask_function=causal_mask_function,
                                            attention_mask=ones), ones)
    wide = torch.ones(2, 9, dtype=torch.bool)
    wide[1, :2] = False
    for seen in (5, 6, 9):  # up to the cache's last slot
        key_mask = backend.padding_mask(2, 1, 9, mask_function=causal_mask_function,
                                        attention_mask=wide[:, :seen])
        assert key_mask.shape == (2, 1, 1, 9) and key_mask.dtype == torch.bool
        assert key_mask[:, 0, 0].tolist() == [[True] * seen + [False] * (9 - seen),
                                              [False] * 2 + [True] * (seen - 2) +
                                              [False] * (9 - seen)]


def test_the_mask_compiles_into_one_graph_and_still_refuses_other_masks():
    # generate() with a StaticCache compiles the decoding steps with fullgraph=True.
    from transformers.masking_utils import (and_masks, causal_mask_function,
                                            sliding_window_bidirectional_overlay)

    def mask_of(attention_mask, part):
        return backend.padding_mask(2, 1, 6, mask_function=and_masks(causal_mask_function, part),
                                    attention_mask=attention_mask)

    left = torch.ones(2, 6, dtype=torch.bool)
    left[1, :2] = False
    compiled = torch.compile(mask_of, fullgraph=True, backend="eager")
    assert torch.equal(compiled(left, causal_mask_function), left[:, None, None])
    assert torch.equal(compiled(left[:, :5], causal_mask_function)[:, 0, 0, :5], left[:, :5])
    with pytest.raises(Exception, match="sliding_window_bidirectional_overlay"):
        compiled(left, sliding_window_bidirectional_overlay(2))


def test_a_mask_with_holes_or_other_shapes_raises():
    from transformers.masking_utils import (causal_mask_function,
                                            sliding_window_bidirectional_mask_function,
                                            sliding_window_causal_mask_function)

    holes = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]], dtype=torch.bool)
    with pytest.raises(ValueError, match="padding between real tokens"):
        backend.padding_mask(2, 4, 4, mask_function=causal_mask_function, attention_mask=holes)
    with pytest.raises(ValueError, match=r"supports causal or bidirectional .* also uses "
                                         r"\['sliding_window_bidirectional_overlay"):
        backend.padding_mask(2, 4, 4, mask_function=sliding_window_bidirectional_mask_function(2))
    # A causal sliding window's mask is the layer's sliding_window, which the kernels take.
    assert backend.padding_mask(2, 4, 4, mask_function=sliding_window_causal_mask_function(2)) \
        is None
    q = torch.zeros(1, 2, 4, 64)
    with pytest.raises(ValueError, match=r"got a mask of shape \(1, 1, 4, 4\)"):
        backend.attention_forward(torch.nn.Module(), q, q, q, torch.ones(1, 1, 4, 4))
    # A key mask (batch, 1, 1, keys) is taken for one query row only, and in one run.
    key_mask = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"got a mask of shape \(1, 1, 1, 4\)"):
        backend.attention_forward(torch.nn.Module(), q, q, q, key_mask)
    key_mask[..., 1] = False
    with pytest.raises(ValueError, match="padding between real tokens"):
        backend.attention_forward(torch.nn.Module(), q[:, :, :1], q, q, key_mask)


def test_sequence_bounds_of_left_and_right_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]],
                        dtype=torch.bool)
    bounds = backend.bounds_of_padding(mask, 5)  # prefill: queries are every column
    assert [t.tolist() for t in bounds.tensors()] == [[2, 0, 0, 0], [5, 3, 5, 0],
                                                      [2, 0, 0, 0], [5, 3, 5, 0]]
    assert all(t.dtype == torch.int32 for t in bounds.tensors())
    bounds = backend.bounds_of_padding(mask, 1)  # decoding: the query is the last column
    assert [t.tolist() for t in bounds.tensors()[:2]] == [[0, 0, 0, 0], [1, 0, 1, 0]]
    assert backend.bounds_of_padding(mask, 1) is bounds  # once per mask, not per layer
    # A StaticCache's step: a key mask over the cache, the query each row's newest key
    # (none in the row with no keys).
    unused = torch.zeros(4, 2, dtype=torch.bool)
    bounds = backend.bounds_of_padding(torch.cat([mask, unused], 1)[:, None, None], 1)
    assert [t.tolist() for t in bounds.tensors()] == [[0, 0, 0, 0], [1, 1, 1, 0],
                                                      [2, 0, 0, 0], [5, 3, 5, 0]]
    assert all(t.dtype == torch.int32 for t in bounds.tensors())


def test_packed_sequences_from_positions():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    cu_seqlens, longest = backend.packed_sequences_of_positions(positions, 9)
    assert cu_seqlens.tolist() == [0, 3, 5, 9] and longest == 4
    assert cu_seqlens.dtype == torch.int32
    assert backend.packed_sequences_of_positions(torch.arange(9)[None], 9) is None
    assert backend.packed_sequences_of_positions(torch.arange(5, 14)[None], 9) is None
    assert backend.packed_sequences_of_positions(positions.expand(2, -1), 9) is None


@pytest.mark.parametrize("option,value", [("position_bias", torch.zeros(1)),
                                          ("output_attentions", True)])
def test_options_it_cannot_honour_raise(option, value):
    q = torch.zeros(1, 2, 4, 64)
    with pytest.raises(ValueError, match=option):
        backend.attention_forward(torch.nn.Module(), q, q, q, None, **{option: value})
    with pytest.raises(ValueError, match="no attention dropout"):
        backend.attention_forward(torch.nn.Module(), q, q, q, None, dropout=0.1)


def test_padded_and_packed_batches_take_the_variants_to_the_varlen_kernel_and_decoding_steps_to_the_decode_kernel(monkeypatch):  # noqa: E501
    """With a padding mask or packed sequences the variants go to the variable-length
    kernel; decoding steps take them to the decode kernel, in attention_with_kvcache's
    names."""
    calls, decoded = [], []

    def varlen_attention(query, key, value, bounds, max_q, max_k, **options):
        calls.append(options)
        return query, None

    def attention_with_kvcache(query, *args, **options):
        decoded.append(options)
        return query

    monkeypatch.setattr(backend, "varlen_attention", varlen_attention)
    monkeypatch.setattr(backend.kvcache, "attention_with_kvcache", attention_with_kvcache)
    sinks = torch.zeros(2)
    prefill = torch.zeros(1, 2, backend.DECODE_MAX_QUERY + 1, 64)
    q, k = torch.zeros(1, 2, 1, 64), torch.zeros(1, 2, prefill.shape[2], 64)
    mask = torch.ones(1, prefill.shape[2], dtype=torch.bool)
    mask[0, 0] = False
    with torch.no_grad():
        backend.attention_forward(torch.nn.Module(), prefill, prefill, prefill, mask,
                                  sliding_window=3, s_aux=sinks)
        backend.attention_forward(torch.nn.Module(), prefill, prefill, prefill, None,
                                  softcap=20.0, cu_seq_lens_q=torch.tensor([0, 17]),
                                  cu_seq_lens_k=torch.tensor([0, 17]), max_length_q=17,
                                  max_length_k=17)
        backend.attention_forward(torch.nn.Module(), q, k, k, mask, softcap=20.0)
        backend.attention_forward(torch.nn.Module(), q, k, k, None, sliding_window=3,
                                  s_aux=sinks)
    assert [c["variants"].window for c in calls] == [(2, 0), None]
    assert [c["variants"].softcap for c in calls] == [None, 20.0]
    assert calls[0]["sinks"] is sinks and calls[0]["variants"].sinks
    assert [(d["window_size"], d["softcap"], d["sinks"]) for d in decoded] == \
        [((-1, -1), 20.0, None), ((2, 0), None, sinks)]


def test_variants_take_transformers_window_as_the_keys_before_and_at_the_query(monkeypatch):
    """transformers' sliding_window W: keys q - W + 1 .. q (its sliding_window_overlay),
    flash-attn's window_size (W - 1, 0); softcap and s_aux as attention() takes them."""
    seen = {}

    def run_attention(query, key, value, causal, scale, with_lse, variants, sinks):
        seen.update(causal=causal, variants=variants, sinks=sinks)
        return query, None

    monkeypatch.setattr(backend, "run_attention", run_attention)
    q, sinks = torch.zeros(1, 2, backend.DECODE_MAX_QUERY + 1, 64), torch.zeros(2)
    backend.attention_forward(torch.nn.Module(), q, q, q, None, sliding_window=16, softcap=30.0,
                              s_aux=sinks)
    assert seen["causal"] == "bottom_right" and seen["sinks"] is sinks
    assert seen["variants"].window == (15, 0) and seen["variants"].softcap == 30.0


def tiny_llama(attn_implementation):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


def twin_llamas():
    ours, sdpa = tiny_llama(backend.register()), tiny_llama("sdpa")
    sdpa.load_state_dict(ours.state_dict())
    return ours, sdpa


def tokens_of(shape, seed=1):
    return torch.randint(1, 128, shape, generator=torch.Generator().manual_seed(seed))


def test_a_small_llama_gives_sdpas_logits_and_gradients(kernels_on_the_cpu):
    ours, sdpa = twin_llamas()
    tokens = tokens_of((2, 33))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens).logits, sdpa(tokens).logits, rtol=1e-4, atol=1e-4)
    loss = ours(tokens, labels=tokens).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in ours.parameters())
    assert kernels_on_the_cpu == {"forward": 2 * 2, "backward": 2}  # 2 layers


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batches_give_sdpas_logits_and_gradients(side, kernels_on_the_cpu):
    ours, sdpa = twin_llamas()
    tokens, mask = tokens_of((3, 20)), torch.ones(3, 20, dtype=torch.long)
    for row, pad in ((1, 5), (2, 19)):
        mask[row, slice(None, pad) if side == "left" else slice(-pad, None)] = 0
    real = mask.bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens, attention_mask=mask).logits[real],
                                   sdpa(tokens, attention_mask=mask).logits[real],
                                   rtol=1e-4, atol=1e-4)
    assert kernels_on_the_cpu["varlen_forward"] == 2 and not kernels_on_the_cpu["forward"]
    labels = tokens.masked_fill(~real, -100)
    for model in (ours, sdpa):
        model(tokens, attention_mask=mask, labels=labels).loss.backward()
    for (name, mine), theirs in zip(ours.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert kernels_on_the_cpu["varlen_backward"] == 2


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_on_a_left_padded_batch_gives_sdpas_tokens(cache, kernels_on_the_cpu):
    ours, sdpa = twin_llamas()
    tokens, mask = tokens_of((3, 12), seed=4), torch.ones(3, 12, dtype=torch.long)
    mask[0, :4], mask[2, :9] = 0, 0
    options = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    if cache == "static":
        options["cache_implementation"] = "static"
    assert torch.equal(ours.generate(tokens, **options), sdpa.generate(tokens, **options))
    # The 12-token prefill and the 5 decoding steps are all short enough for the decode
    # kernel (up to DECODE_MAX_QUERY new tokens), each row's keys from its padding mask.
    assert kernels_on_the_cpu["decode"] == 2 * 6 and not kernels_on_the_cpu["varlen_forward"]


def test_packed_training_batch_gives_the_padded_batchs_loss_and_gradients(kernels_on_the_cpu):
    lengths = [7, 12, 5]
    ours = tiny_llama(backend.register())
    twin = tiny_llama(backend.register())
    twin.load_state_dict(ours.state_dict())
    sequences = [tokens_of((1, n), seed=n)[0] for n in lengths]
    packed = torch.cat(sequences)[None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    labels = torch.cat([torch.cat([torch.tensor([-100]), s[1:]]) for s in sequences])[None]
    ours(packed, position_ids=positions, labels=labels).loss.backward()
    padded = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(padded)
    for row, s in enumerate(sequences):
        padded[row, :len(s)], mask[row, :len(s)] = s, 1
    padded_labels = padded.masked_fill(mask == 0, -100)
    padded_labels[:, 0] = -100
    # Per-token mean: the padded batch's loss counts the same tokens.
    twin(padded, attention_mask=mask, labels=padded_labels).loss.backward()
    for (name, mine), theirs in zip(ours.named_parameters(), twin.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-3, atol=1e-5, msg=name)
    # Packed: the first model ran varlen over cu_seqlens found in the positions.
    assert kernels_on_the_cpu["varlen_forward"] == 2 * 2 and not kernels_on_the_cpu["forward"]


def test_flash_style_packing_keywords_are_used_as_given(kernels_on_the_cpu):
    q, k = torch.randn(1, 4, 9, 64), torch.randn(1, 2, 9, 64)
    cu_seqlens = torch.tensor([0, 4, 9], dtype=torch.int32)
    out, _ = backend.attention_forward(torch.nn.Module(), q, k, k, None, cu_seq_lens_q=cu_seqlens,
                                       cu_seq_lens_k=cu_seqlens, max_length_q=5, max_length_k=5)
    first, _ = backend.attention_forward(torch.nn.Module(), q[:, :, :4], k[:, :, :4],
                                         k[:, :, :4], None)
    torch.testing.assert_close(out[:, :4], first)
    assert kernels_on_the_cpu["varlen_forward"] == 1


@pytest.mark.parametrize("architecture", ["gemma2", "gpt-oss"])
def test_softcap_window_and_sink_models_run_in_the_demo_against_eager(architecture,
                                                                     kernels_on_the_cpu):
    """The demo's Gemma-2-like and gpt-oss-like models, with the variants' kernels replaced
    by float64: eager's logits, padded too, its greedy tokens, and its training losses step
    by step (the variants' backward through transformers, the sinks' gradient included)."""
    from cutile_fmha.assets import fmha_llama_demo as demo

    args = demo.parse_args(["--architecture", architecture, "--layers", "2", "--hidden-size",
                            "256", "--heads", "4", "--kv-heads", "2", "--vocab-size", "64",
                            "--batch", "2", "--seq-len", "40", "--new-tokens", "3",
                            "--sliding-window", "16", "--softcap", "5", "--train-steps", "4"])
    result = demo.run(args, torch.device("cpu"), dtype=torch.float32)
    text, ok = demo.report(result, args)
    assert ok, text
    assert result["reference"] == "eager"
    assert result["logit_difference"] < 1e-4 and result["padded_logit_difference"] < 1e-4
    assert result["generate"]["agreeing"] == result["generate"]["tokens"] == 2 * 3
    torch.testing.assert_close(result["losses"]["cutile_fmha"], result["losses"]["eager"],
                               rtol=1e-4, atol=1e-4)
    # Unpadded prefills and training take the dense variants' kernel, padded prefills and
    # packed training the variable-length one, decoding steps the decode kernel.
    assert kernels_on_the_cpu["variants"] and kernels_on_the_cpu["varlen_forward"]
    assert kernels_on_the_cpu["backward"] and kernels_on_the_cpu["varlen_backward"]
    assert kernels_on_the_cpu["decode"] and not kernels_on_the_cpu["forward"]


def test_llama_demo_profiles_each_models_training_step(kernels_on_the_cpu):
    from cutile_fmha.assets import fmha_llama_demo as demo

    args = demo.parse_args(["--profile", "--profile-top", "5", "--layers", "1",
                            "--hidden-size", "256", "--heads", "2", "--kv-heads", "1",
                            "--vocab-size", "32", "--batch", "2", "--seq-len", "16",
                            "--train-steps", "2"])
    text = demo.profile_training(args, torch.device("cpu"), dtype=torch.float32)
    assert "cutile_fmha: " in text and f"{SDPA_NAME}: " in text and "ms per training step" in text
    assert text.count("CPU ms per step") == 2 and "aten::" in text
    # one warm-up step and two profiled ones, through our backward each time
    assert kernels_on_the_cpu["forward"] == kernels_on_the_cpu["backward"] == 3


def test_llama_demo_runs_and_reports(kernels_on_the_cpu):
    from cutile_fmha.assets import fmha_llama_demo as demo

    args = demo.parse_args(["--layers", "1", "--hidden-size", "256", "--heads", "4",
                            "--kv-heads", "2", "--vocab-size", "64", "--batch", "2",
                            "--seq-len", "40", "--train-steps", "4", "--new-tokens", "3",
                            "--dtype", "float16", "--rounds", "3"])
    # float32: what the kernels' CPU stand-in computes in; on the GPU the demo runs fp16/bf16
    result = demo.run(args, torch.device("cpu"), dtype=torch.float32)
    text, ok = demo.report(result, args)
    assert ok, text
    assert result["logit_difference"] < 1e-4 and result["padded_logit_difference"] < 1e-4
    assert len(result["losses"]["cutile_fmha"]) == len(result["packed_losses"][SDPA_NAME]) == 4
    assert result["generate"]["agreeing"] == result["generate"]["tokens"] == 2 * 3
    # one layer. Dense: prefill once for the logits and 4 times timed (a warm-up, then 3
    # rounds), 4 training steps.
    # Variable length: the padded prefill once and 4 times timed, generate()'s prefill five
    # times (once compared, 4 times timed), 4 packed training steps. Decode: generate()'s 2
    # decoding steps, five times.
    assert kernels_on_the_cpu == {"forward": 1 + 4 + 4, "backward": 4,
                                  "varlen_forward": 1 + 4 + 5 + 4, "varlen_backward": 4,
                                  "decode": 5 * 2}
    for line in ("tokens/s", "padded prefill", "packed training", "generate() of 3 tokens"):
        assert line in text


def test_a_batch_of_several_rows_is_not_searched_for_packed_sequences(monkeypatch,
                                                                       kernels_on_the_cpu):
    """A model passes its (1, q_len) positions with every batch; finding packed sequences in
    them reads the device (a host stall per forward), which only a one-row batch needs."""
    looked = []
    search = backend.packed_sequences_of_positions
    monkeypatch.setattr(backend, "packed_sequences_of_positions",
                        lambda *args: looked.append(args) or search(*args))
    q_len = backend.DECODE_MAX_QUERY + 1  # a prefill, for the dense kernel
    positions = torch.arange(q_len)[None]
    for batch in (2, 1):
        q = torch.randn(batch, 2, q_len, 64)
        backend.attention_forward(torch.nn.Module(), q, q, q, None, position_ids=positions)
    assert len(looked) == 1 and kernels_on_the_cpu["forward"] == 2
