"""What a compiled program computes and moves, counted from its HLO, and which compute the
compiler scheduled inside each asynchronous collective's window."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardscope._src.audit.overlap import (
    Kernel,
    kernel_costs,
    overlaps,
    program_cost,
    program_kernels,
    windows,
)
from shardscope._src.base.errors import HloParseError
from shardscope._src.cost.compute import dot_seconds, kernels_seconds, roofline_seconds
from shardscope._src.hlo.cost import ConvWindow, Cost, DotArithmetic, instruction_cost, total
from shardscope._src.hlo.parse import parse_hlo
from shardscope._src.targets.hardware import hardware

TARGETS = Path(__file__).parent / "fixtures" / "hlo_targets"
D, FF, LAYERS = 256, 1024, 3  # generate.py's fsdp_step and tp_step


def _fixture(name: str):
    return parse_hlo((TARGETS / f"{name}.hlo").read_text())


@pytest.mark.parametrize("target", ["h100x8", "v5px8"])
def test_a_scanned_fsdp_step_counts_every_matmul_of_every_layer(target):
    # Per device: 64 / 8 = 8 rows. Each layer runs two matmuls forward and four backward
    # (each matmul's input and weight gradients), each 2 x 8 x D x FF FLOPs; the GPU writes
    # them as dots in gemm fusions, the TPU as convolutions.
    rows = 64 // 8
    assert program_cost(_fixture(f"{target}/fsdp_step")).flops == LAYERS * 6 * 2 * rows * D * FF


@pytest.mark.parametrize("target", ["h100x8", "v5px8"])
def test_a_tensor_parallel_step_counts_no_gradient_of_its_input(target):
    # data=2 x model=4: 16 / 2 = 8 rows, FF / 4 = 256 hidden columns per device. Forward two
    # matmuls, backward three (both weight gradients, the hidden activation's; the input x
    # is not differentiated).
    rows, hidden = 16 // 2, FF // 4
    assert program_cost(_fixture(f"{target}/tp_step")).flops == 5 * 2 * rows * D * hidden


@pytest.mark.parametrize("target", ["h100x8", "v5px8"])
def test_attentions_batched_einsums_count_the_same_on_both_compilers(target):
    # generate.py's attention_step: one sequence of 16 per device, d 32, 2 key/value heads of
    # 2 queries each, head_dim 8 (the projection's output: 2 x (2 + 2) x 8 = 64 columns).
    # Forward: the projection, then QK^T and PV (2 x 16 x 16 x 8 per query head, 4 heads).
    # Backward: the projection's weight gradient (the input is not differentiated), and two
    # matmuls for each of QK^T and PV.
    projection = 2 * 16 * 32 * 64
    core = 2 * 4 * 16 * 16 * 8
    assert program_cost(_fixture(f"{target}/attention_step")).flops == 2 * projection + 6 * core


def test_the_tpus_padded_batch_dimensions_are_no_work():
    # The TPU writes the projection bf16[16,2,4,8] <- [16 tokens, 32] x [32, 2, 4, 8] as a
    # convolution over two spatial dimensions of one element, padded to the kernel's 2 x 4:
    # each output position meets the input at one tap, so it is a plain 16 x 32 x 64 matmul.
    m = _fixture("v5px8/attention_step")
    (comp, ins) = next(
        (c, i)
        for c in m.computations.values()
        for i in c.instructions
        if i.opcode == "convolution"
        and "pad=1_1x3_3" in i.attributes.get("window", "")
        and "jvp" in i.metadata.op_name
        and "transpose" not in i.metadata.op_name
    )
    assert instruction_cost(m, comp, ins).flops == 2 * 16 * 32 * 64


def test_a_convolution_window_is_read_into_its_fields():
    w = ConvWindow.parse("{size=2x2 pad=0_0x1_1 lhs_dilate=2x1 rhs_reversal=0x1}")
    assert (w.size, w.pad_low, w.pad_high) == ((2, 2), (0, 1), (0, 1))
    assert (w.lhs_dilate, w.rhs_dilate, w.stride) == ((2, 1), (1, 1), (1, 1))
    assert ConvWindow.parse("{size=3 pad=-1_2 stride=2}").pad_low == (-1,)
    assert ConvWindow.parse("", 2).size == (1, 1)  # no window attribute: 1 x 1
    for bad in ("{size=2 dilate=2}", "{size=2 pad=1}", "{size=2x2 stride=1}", "{size=a}"):
        with pytest.raises(HloParseError, match="convolution window"):
            ConvWindow.parse(bad)


def _brute_taps(size, stride, low, lhs_dilate, rhs_dilate, inputs, outputs):
    last = (inputs - 1) * lhs_dilate
    return sum(
        1
        for o in range(outputs)
        for k in range(size)
        if 0 <= (q := o * stride + k * rhs_dilate - low) <= last and q % lhs_dilate == 0
    )


@given(
    size=st.integers(1, 6),
    stride=st.integers(1, 4),
    low=st.integers(-3, 6),
    lhs_dilate=st.integers(1, 4),
    rhs_dilate=st.integers(1, 3),
    inputs=st.integers(1, 9),
    outputs=st.integers(1, 12),
)
def test_window_taps_count_each_output_and_tap_that_meets_the_input(
    size, stride, low, lhs_dilate, rhs_dilate, inputs, outputs
):
    w = ConvWindow((size,), (stride,), (low,), (0,), (lhs_dilate,), (rhs_dilate,))
    want = _brute_taps(size, stride, low, lhs_dilate, rhs_dilate, inputs, outputs)
    assert w.taps(0, inputs, outputs) == want


#: A scheduled module written by hand: two fusions and a loop inside asynchronous windows,
#: an in-place update, a convolution, a synchronous all-reduce.
HANDWRITTEN = (Path(__file__).parent / "fixtures" / "hlo_handwritten" / "costs.hlo").read_text()
MATMUL = 2 * 64 * 32 * 128  # f32[64,32] = bf16[64,128] @ bf16[128,32]
MATMUL_BYTES = 64 * 128 * 2 + 128 * 32 * 2 + 64 * 32 * 4  # both operands read, result written
SCALE_BYTES = 64 * 32 * 4 + 32 * 4 + 64 * 32 * 4  # x and y read, the product written
CONV = 2 * (2 * 8 * 8 * 8) * (4 * 3 * 3)  # result elements x kernel elements per output


def _instructions():
    m = parse_hlo(HANDWRITTEN)
    entry = m.computations[m.entry_name]
    return m, entry, entry.by_name


def test_a_fusion_costs_its_matmuls_and_the_bytes_at_its_boundary():
    m, entry, ins = _instructions()
    # a matmul's bytes are matmul bytes; an element-wise fusion's are not
    assert instruction_cost(m, entry, ins["mm"]) == Cost(MATMUL, MATMUL_BYTES, MATMUL_BYTES)
    assert instruction_cost(m, entry, ins["sc"]) == Cost(0, SCALE_BYTES, 0)


def test_an_in_place_update_moves_only_its_update():
    m, entry, ins = _instructions()
    # The 16-slice buffer is neither read nor written whole: the update is read and written,
    # the index read (4 bytes).
    assert instruction_cost(m, entry, ins["up"]) == Cost(0, 2 * 64 * 32 * 4 + 4)


def test_a_slice_or_gather_reads_only_what_it_takes():
    m, entry, ins = _instructions()
    # one of the 16 layers of a stacked buffer (the index read too), fused or not, and three
    # rows of x gathered by their indices
    layer = 64 * 32 * 4
    assert instruction_cost(m, entry, ins["take"]) == Cost(0, layer + 4 + layer)
    assert instruction_cost(m, entry, ins["two"]) == Cost(0, 2 * layer + 4 + 2 * layer)
    assert instruction_cost(m, entry, ins["rows"]) == Cost(0, 3 * 32 * 4 + 3 * 4 + 3 * 32 * 4)


def test_only_device_memory_is_traffic_and_a_move_on_chip_reads_it_once():
    m = parse_hlo(
        (Path(__file__).parent / "fixtures/hlo_handwritten/memory_spaces.hlo").read_text()
    )
    entry = m.computations[m.entry_name]
    ins = entry.by_name
    # w's rows 256:512 and all of v, each 256 x 128 bf16; an 8 x 128 bf16 output
    quarter, whole, acts = (512 - 256) * 128 * 2, 256 * 128 * 2, 8 * 128 * 2
    # the slice of a quarter of w read from device memory into on-chip memory (not the
    # whole of w), the prefetch of v likewise; their ends move nothing
    assert instruction_cost(m, entry, ins["ss"]) == Cost(0, quarter)
    assert instruction_cost(m, entry, ins["cs"]) == Cost(0, whole)
    assert instruction_cost(m, entry, ins["sd"]) == instruction_cost(m, entry, ins["cd"]) == Cost()
    # the matmuls read x from device memory and their weights on chip, and write their output
    flops = 2 * 8 * 256 * 128
    moved = 8 * 256 * 2 + acts
    assert instruction_cost(m, entry, ins["a"]) == Cost(flops, moved, moved)
    assert instruction_cost(m, entry, ins["b"]) == Cost(flops, moved, moved)
    # a copy from the host is a transfer over its link, not counted here
    assert instruction_cost(m, entry, ins["hs"]) == Cost()


def test_a_dimension_that_is_no_number_is_refused_in_one_line():
    text = HANDWRITTEN.replace(
        "lhs_contracting_dims={1}", "lhs_contracting_dims={" + "9" * 5000 + "}"
    )
    with pytest.raises(HloParseError, match="is not a dimension"):
        program_cost(parse_hlo(text))


def test_a_convolution_counts_kernel_elements_per_output_feature():
    m, entry, ins = _instructions()
    assert instruction_cost(m, entry, ins["conv"]).flops == CONV


def test_collectives_control_flow_and_free_instructions_cost_nothing_themselves():
    m, entry, ins = _instructions()
    for name in ("ars", "ard", "ags", "agd", "sync", "loop", "u", "init", "zero", "out"):
        assert instruction_cost(m, entry, ins[name]) == Cost(), name


def test_the_program_counts_a_loop_body_once_per_trip():
    m, _, _ = _instructions()
    # Outside the loop: the matmul fusion and the convolution; inside: one matmul per trip.
    assert program_cost(m).flops == MATMUL + CONV + 5 * MATMUL
    # and moves their operands and results: the image and kernel read, the features written
    conv_bytes = 2 * 10 * 10 * 4 * 4 + 4 * 3 * 3 * 8 * 4 + 2 * 8 * 8 * 8 * 4
    assert program_cost(m).matmul_bytes == MATMUL_BYTES + conv_bytes + 5 * MATMUL_BYTES


def test_a_fused_scope_is_one_kernel_that_moves_only_what_crosses_its_boundary():
    m = parse_hlo(
        (Path(__file__).parent / "fixtures/hlo_handwritten/attention_core.hlo").read_text()
    )
    q = kv = o = 4 * 16 * 32 * 2  # bf16 [4, 16, 32]
    scores, probs = 4 * 16 * 16 * 4, 4 * 16 * 16 * 2  # f32 and bf16 [4, 16, 16]
    flops = 2 * (2 * 4 * 16 * 16 * 32)  # the scores' matmul and the weighted values'
    added = Cost(0, o + q + o)  # the addition outside: the bitcast result and q read
    # kernel by kernel, the scores go out to memory and back at each step, and the keys
    # and values are read by each matmul
    assert kernel_costs(m) == {
        Kernel(Cost(flops // 2, q + kv + scores, q + kv + scores)): 1,
        Kernel(Cost(0, scores + scores)): 1,
        Kernel(Cost(0, scores + probs)): 1,
        Kernel(Cost(flops // 2, probs + kv + o, probs + kv + o)): 1,
        Kernel(added): 1,
    }
    assert program_kernels(m) == 5
    # fused: one kernel (the exponential with it: it reads the scores and only the scope
    # reads its result) reads q and the keys and values (once, under both their names) and
    # writes the output (used outside the scope through the bitcast); the scores stay on chip
    assert kernel_costs(m, scope="attention_core") == {
        Kernel(Cost(flops, q + kv + o, q + kv + o), fused=True): 1,
        Kernel(added): 1,
    }
    # a scope is a whole segment of the op name: a prefix of one is not it
    assert kernel_costs(m, scope="attention_cor") == kernel_costs(m)


def test_a_softmax_left_as_a_chain_of_nameless_kernels_is_in_the_fused_core():
    m = parse_hlo(
        (Path(__file__).parent / "fixtures/hlo_handwritten/softmax_chain.hlo").read_text()
    )
    q = kv = o = 4 * 16 * 32 * 2  # bf16 [4, 16, 32]
    flops = 2 * (2 * 4 * 16 * 16 * 32)  # the scores' matmul and the weighted values'
    # the maximum, its negation and the sum read the scores (or each other) and only the
    # core reads their results: one kernel that reads q, the keys and values once and
    # writes the output; the scores (f32 [4, 16, 16]) never leave the chip
    assert kernel_costs(m, scope="attention_core") == {
        Kernel(Cost(flops, q + kv + o, q + kv + o), fused=True): 1,
        Kernel(Cost(0, o + q + o)): 1,
    }
    assert program_kernels(m) == 7  # kernel by kernel: both matmuls, the four fusions, the add


def test_a_fused_scope_is_what_passes_results_within_it_and_prices_others_on_their_own():
    m = parse_hlo((Path(__file__).parent / "fixtures/hlo_handwritten/scope_cases.hlo").read_text())
    whole, half = 64 * 64 * 4, 32 * 64 * 4  # f32 [64, 64] and [32, 64]
    matmul = 2 * 32 * 64 * 64
    update = Cost(0, half + 4 + half)  # the update read and written in place, the index read
    exponential = Cost(0, whole + whole)  # of c, read and written: the unrelated, the called
    negation = Cost(0, half + half)  # of the first matmul's result, which it returns
    # the slice, both matmuls and the exponential of a, though an unrelated kernel runs
    # between them, are one kernel: it reads a (its whole, which the slice took a half
    # of) and b once, and writes both matmuls' results, which the update and the negation
    # (no op name, but its result leaves) read; the update and the call are priced as
    # they are outside the scope
    fused = whole + whole + half + half
    assert kernel_costs(m, scope="core") == {
        Kernel(Cost(2 * matmul, fused, fused, f32_flops=2 * matmul), fused=True): 1,
        Kernel(exponential): 2,
        Kernel(update): 1,
        Kernel(negation): 1,
    }
    # kernel by kernel: the slice reads its half and writes it (as the negation does),
    # each matmul reads its operands and writes its result; f32 products, counted so
    moved = half + whole + half
    assert kernel_costs(m) == {
        Kernel(Cost(0, half + half)): 2,
        Kernel(Cost(matmul, moved, moved, f32_flops=matmul)): 2,
        Kernel(exponential): 3,
        Kernel(update): 1,
    }


def test_a_window_holds_what_the_schedule_puts_between_start_and_done():
    m, _, _ = _instructions()
    found = windows(m)
    assert set(found) == {"ars", "ags"}
    first = found["ars"]
    assert (first.done, first.instructions, first.collectives) == ("ard", 2, 0)
    assert first.compute == Cost(MATMUL, MATMUL_BYTES + SCALE_BYTES, MATMUL_BYTES)
    # The while loop between all-gather-start and -done runs its matmul five times.
    second = found["ags"]
    assert second.compute.flops == 5 * MATMUL


class _Device:
    peak_flops = 1e12
    matmul_fraction = 0.5
    hbm_bandwidth = 1e9


def test_exposed_time_is_what_the_window_compute_leaves_of_the_collective():
    m, _, _ = _instructions()
    device = _Device()
    window = windows(m)["ars"]
    hidden = max(MATMUL / (1e12 * 0.5), (MATMUL_BYTES + SCALE_BYTES) / 1e9)
    assert roofline_seconds(window.compute, device) == pytest.approx(hidden, rel=1e-12)
    got = overlaps(
        m,
        {"ars": (3 * hidden, True), "ags": (1e-9, True), "sync": (2e-3, False)},
        device,
    )
    assert got["ars"].exposed_s == pytest.approx(2 * hidden, rel=1e-12)
    assert got["ags"].exposed_s == 0.0  # fully hidden by five trips of the loop
    assert got["sync"].exposed_s == 2e-3 and got["sync"].hidden_s == 0.0


def test_a_hidden_collective_is_exposed_for_the_compute_its_multiprocessors_take():
    # The all-gather hides behind five trips of the loop, but holds a quarter of the device
    # while it runs: the compute beside it is a quarter of its time late. The all-reduce
    # the window covers a third of stays exposed for the rest of it.
    m, _, _ = _instructions()
    device = _Device()
    hidden = roofline_seconds(windows(m)["ars"].compute, device)
    got = overlaps(
        m, {"ars": (3 * hidden, True), "ags": (1e-9, True)}, device, {"ars": 0.25, "ags": 0.25}
    )
    assert got["ags"].exposed_s == pytest.approx(1e-9 / 4, rel=1e-12)
    assert got["ags"].hidden_s == pytest.approx(1e-9 * 3 / 4, rel=1e-12)
    assert got["ars"].exposed_s == pytest.approx(2 * hidden, rel=1e-12)


def test_the_gpu_compiler_leaves_the_forward_all_gather_of_a_scanned_fsdp_step_exposed():
    # The H100 compiler starts each layer's weight all-gather in the loop body and waits for
    # it before the layer's first matmul: no matmul sits in the window. The gradient
    # reduce-scatter of the backward body has one of the layer's matmuls beside it.
    found = windows(_fixture("h100x8/fsdp_step"))
    forward = [w for w in found.values() if w.start.startswith("all-gather-start")]
    assert forward and all(w.compute.flops == 0 for w in forward)
    (scatter,) = [w for w in found.values() if w.start.startswith("reduce-scatter-start")]
    assert scatter.compute.flops == 2 * (64 // 8) * D * FF


#: The line the GPU compiler's rematerialization pass logs for a program that does not fit.
PRESSURE_LOG = (
    "W1201 10:00:00.000000 1 hlo_rematerialization.cc:3100] Can't reduce memory use below "
    "56.41GiB (60570427392 bytes) by rematerialization; only reduced to 87.14GiB (93567040840 "
    "bytes), down from 87.14GiB (93567040840 bytes) originally"
)


def test_the_compilers_word_that_a_program_does_not_fit_is_read_from_its_log():
    from shardscope._src.audit.compile import parse_memory_pressure
    from shardscope._src.audit.records import MemoryPressure

    got = parse_memory_pressure("I1201 other line\n" + PRESSURE_LOG)
    assert got == MemoryPressure(60570427392, 93567040840, 93567040840)
    assert parse_memory_pressure("I1201 nothing of the kind") is None
    assert MemoryPressure.from_dict(got.to_dict()) == got


def test_calls_nested_deeper_than_pythons_stack_leave_the_counts_unknown():
    import shardscope

    n = 3000  # computations calling each other in a chain, deeper than the recursion limit
    chain = [
        f"%c{i} (p: f32[4]) -> f32[4] {{\n  %p = f32[4]{{0}} parameter(0)\n"
        + (
            f"  ROOT %r = f32[4]{{0}} call(%p), to_apply=%c{i + 1}\n}}\n"
            if i + 1 < n
            else "  ROOT %r = f32[4]{0} add(%p, %p)\n}\n"
        )
        for i in range(n)
    ]
    entry = (
        "ENTRY %main (x: f32[4]) -> f32[4] {\n  %x = f32[4]{0} parameter(0)\n"
        "  ROOT %y = f32[4]{0} call(%x), to_apply=%c0\n}\n"
    )
    a = shardscope.audit("HloModule deep, num_partitions=1\n\n" + "\n".join(chain) + entry)
    assert (a.hlo_flops, a.hlo_bytes) == (None, None) and a.collectives == ()


def test_each_matmul_is_counted_and_priced_at_the_arithmetic_its_hlo_states():
    m = parse_hlo(
        (Path(__file__).parent / "fixtures/hlo_handwritten/dot_arithmetic.hlo").read_text()
    )
    dot = 2 * 64 * 32 * 128  # each of the five: f32[64,32] of [64,128] @ [128,32]
    got = total(k.cost * n for k, n in kernel_costs(m).items())
    # as the HLO states them: bf16 operands; f32 at highest; the cuBLAS call's f32 at DEFAULT
    # (from its backend_config); the converted operands' two f32 products, one at high
    assert (got.flops, got.flops_of(DotArithmetic.NARROW)) == (5 * dot, dot)
    assert (got.f32_flops, got.f32_high_flops, got.f32_highest_flops) == (2 * dot, dot, dot)
    # where the compiler widened 16-bit products (XLA:CPU), the products of converted bf16
    # operands, directly or through a fusion's parameters, are 16-bit's
    cpu = total(k.cost * n for k, n in kernel_costs(m, widened=True).items())
    assert (cpu.flops_of(DotArithmetic.NARROW), cpu.f32_flops, cpu.f32_high_flops) == (
        3 * dot,
        dot,
        0,
    )
    assert cpu.f32_highest_flops == dot
    # each at its own rate: on an H100 16-bit at 989 TFLOP/s, f32 at default and high as
    # TF32 (494.5, half of the datasheet's 989 with sparsity), at highest as fp32 (67), all
    # at the same fraction 0.54
    rate = 0.54e12
    assert dot_seconds(hardware("h100"), got) == pytest.approx(
        dot / (989 * rate) + 3 * dot / (494.5 * rate) + dot / (67 * rate), rel=1e-12
    )
    # a GPU's kernels one after another, each at its arithmetic's rate (nothing moved: its
    # FLOPs alone), unless the caller gives the FLOPs' seconds (a server's flat rates)
    # (each above the least a kernel runs)
    runs = {Kernel(Cost(10**10, f32_flops=10**10)): 2, Kernel(Cost(10**10)): 1}
    assert kernels_seconds(hardware("h100"), runs) == pytest.approx(
        2e10 / (494.5 * rate) + 1e10 / (989 * rate), rel=1e-12
    )
    assert kernels_seconds(hardware("h100"), runs, (1e-15, 1e-15)) == pytest.approx(3e-5)
    # on a TPU an f32 product is bf16 passes at the peak: one at default, three at high,
    # six at highest
    assert dot_seconds(hardware("tpu-v5e"), got) == pytest.approx(
        (dot + 2 * dot + 3 * dot + 6 * dot) / (197e12 * 0.75), rel=1e-12
    )


def test_an_fp8_product_runs_at_the_fp8_rate_where_the_device_has_one():
    from shardscope._src.hlo.cost import dot_arithmetic

    # both operands 8-bit floats: fp8's arithmetic; one of them bf16: 16-bit's
    assert dot_arithmetic(("f8e4m3fn", "f8e5m2"), "default") is DotArithmetic.F8
    assert dot_arithmetic(("f8e4m3fn", "bf16"), "default") is DotArithmetic.NARROW
    fp8 = Cost(10**12, f8_flops=10**12)
    # an H100 at its dense fp8 1979 TFLOP/s x 0.48; an A100, which has no fp8 units, at bf16's
    assert dot_seconds(hardware("h100"), fp8) == pytest.approx(1e12 / (1979e12 * 0.48))
    assert dot_seconds(hardware("a100"), fp8) == pytest.approx(1e12 / (312e12 * 0.585))
