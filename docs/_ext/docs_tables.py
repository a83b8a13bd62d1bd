"""Tables the reference pages render from the code and the benchmarks' output, so that no
number in the docs is typed by hand. The pages call these in cells whose input is hidden;
everything here reads records the package already has."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    # a message's "<name>" is text, not an HTML tag
    text = text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return " ".join(text.split())


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Any:
    """A Markdown table, displayed as the cell's output (MyST renders it as a table)."""
    from IPython.display import Markdown

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return Markdown("\n".join(lines))


def percent(x: float | None, *, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


# -- the knobs of a request type -------------------------------------------------------------


def knobs(request_type: type) -> Any:
    """Every field of a request type (``PlanRequest``, ``ServeRequest``, ...): its flag on the
    command line, its default and what it does, as the parser prints them."""
    from shardscope._src.base.knobs import knob_of

    rows = []
    for f in dataclasses.fields(request_type):
        spec = knob_of(f)
        if spec is None:
            continue
        flag = spec.flag or "--" + f.name.replace("_", "-")
        if spec.default_text is not None:
            default = spec.default_text
        elif f.default is dataclasses.MISSING:
            default = "required"
        else:
            default = repr(f.default.value if hasattr(f.default, "value") else f.default)
        rows.append((f"`{f.name}`", f"`{flag}`", default, spec.help))
    return markdown(("field", "flag", "default", "what it sets"), rows)


# -- hardware, targets and the time model's sources ------------------------------------------


def hardware_presets() -> Any:
    """The hardware presets' constants, as :func:`shardscope.hardware` returns them."""
    import shardscope
    from shardscope._src.targets.hardware import PRESETS

    def tera(x: float) -> str:
        return f"{x / 1e12:,.0f}" if x else "-"

    rows = []
    for name in PRESETS:
        h = shardscope.hardware(name)
        rows.append(
            (
                f"`{name}`",
                tera(h.peak_flops),
                tera(h.fp8_peak_flops),
                f"{h.tf32_peak_flops / 1e12:,g}" if h.tf32_peak_flops else "-",
                f"{h.fp32_peak_flops / 1e12:,g}" if h.fp32_peak_flops else "-",
                f"{h.memory_bytes / 2**30:,.1f}",
                f"{h.hbm_bandwidth / 1e12:,.2f}",
                f"{h.link_bandwidth / 1e9:,.0f}",
                f"{h.cross_node_bandwidth / 1e9:,.1f}",
                h.node_size,
                f"{h.latency_s * 1e6:g}",
                f"{h.matmul_fraction:g}",
                f"{h.fp8_matmul_fraction:g}" if h.fp8_matmul_fraction else "-",
                f"{h.comm_fraction:g}",
                f"{h.hbm_fraction:g}",
                "yes" if h.tp_overlap else "no",
            )
        )
    return markdown(
        (
            "preset",
            "bf16 TFLOP/s",
            "fp8 TFLOP/s",
            "TF32 TFLOP/s",
            "fp32 TFLOP/s",
            "memory GiB",
            "HBM TB/s",
            "link GB/s",
            "across nodes GB/s",
            "node",
            "latency us",
            "matmul fraction",
            "fp8 fraction",
            "comm fraction",
            "HBM fraction",
            "TP overlapped",
        ),
        rows,
    )


def hardware_sources() -> Any:
    """Each preset's ``source``: where its datasheet numbers come from."""
    import shardscope
    from shardscope._src.targets.hardware import PRESETS

    return markdown(
        ("preset", "source"), ((f"`{n}`", shardscope.hardware(n).source) for n in PRESETS)
    )


def time_model_sources() -> Any:
    """``TIME_MODEL_SOURCES``: each constant of the time model and where it comes from."""
    from shardscope._src.targets.hardware import TIME_MODEL_SOURCES

    return markdown(("constant", "source"), TIME_MODEL_SOURCES.items())


def serving_engines() -> Any:
    """``ENGINES``: each serving engine's host costs."""
    from shardscope._src.targets.engines import ENGINES
    from shardscope._src.targets.hardware import ATTENTION_FORWARD, hardware

    def us(seconds: float) -> str:
        return f"{seconds * 1e6:,.0f} us"

    def kernels(e: Any) -> str:
        on = {g: e.prefill_attention(hardware(g)) for g in ATTENTION_FORWARD}
        return ", ".join(f"{g} {k.kernel}" for g, k in on.items() if k is not None)

    rows = [
        (
            f"`{e.name}`",
            e.about,
            us(e.step_s),
            us(e.sequence_s),
            "yes" if e.overlapped else "no",
            f"{e.request_s * 1e3:g} ms",
            kernels(e),
            "all of it" if e.memory is None else e.memory.about(),
            "as its memory holds"
            if e.sequences is None
            else ", ".join(f"{e.max_sequences(hardware(g))} on {g}" for g in ("h100", "a100")),
        )
        for e in ENGINES.values()
    ]
    header = (
        "engine", "what it is", "a step", "a sequence", "overlapped", "a request",
        "prefill attention", "device memory it holds", "sequences a replica",
    )  # fmt: skip
    return markdown(header, rows)


def serving_engine_sources() -> Any:
    """``ENGINE_SOURCES``: where each engine's constants come from."""
    from shardscope._src.targets.engines import ENGINE_SOURCES

    return markdown(("constants", "source"), ENGINE_SOURCES.items())


def capabilities() -> Any:
    """What each compiler does that the verdict and the planner account for, and how each
    record was measured."""
    from IPython.display import Markdown

    import shardscope

    seen: dict[str, Any] = {}
    for name, target in shardscope.TARGETS.items():
        seen.setdefault(target.family.value, (name, target))
    fields = [f.name for f in dataclasses.fields(shardscope.Capabilities) if f.name != "source"]
    header = ("field", *(f"{fam} (`{name}`...)" for fam, (name, _) in seen.items()))
    rows = []
    for field in fields:
        values = []
        for _, target in seen.values():
            v = getattr(target.capabilities, field)
            values.append(getattr(v, "value", v))
        rows.append((f"`{field}`", *values))
    table = markdown(header, rows).data
    measured = "\n".join(
        f"- {target.capabilities.compiler}: {_cell(target.capabilities.source)}"
        for _, target in seen.values()
    )
    return Markdown(f"{table}\n\nMeasured on:\n\n{measured}")


def targets() -> Any:
    import shardscope

    return markdown(
        ("target", "compiler", "description"),
        (
            (f"`{name}`", t.family.value, getattr(t, "description", ""))
            for name, t in shardscope.TARGETS.items()
        ),
    )


# -- errors ----------------------------------------------------------------------------------


def error_classes() -> list[type]:
    """Every exception class the package defines, in the order of its errors module."""
    from shardscope._src.base import errors

    found = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, Exception)
        and c.__module__ == errors.__name__
        and not c.__name__.startswith("_")
    ]
    source = inspect.getsource(errors)
    return sorted(found, key=lambda c: source.index(f"class {c.__name__}("))


def _plain(text: str) -> str:
    """A docstring's reStructuredText roles and literals as Markdown code."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def error_table(examples: dict[str, str]) -> Any:
    """The error classes: what each subclasses (up to the built-in one), when it is raised
    (its docstring's first paragraph) and, where the page raised one, what it said."""
    import builtins

    import shardscope

    rows = []
    for cls in error_classes():
        chain = []
        for base in cls.__mro__[1:]:
            if base.__name__.startswith("_"):
                continue
            chain.append(base.__name__)
            if getattr(builtins, base.__name__, None) is base:
                break
        public = hasattr(shardscope, cls.__name__)
        when = _plain(" ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split()))
        rows.append(
            (
                f"`{cls.__name__}`" + ("" if public else " (internal)"),
                ", ".join(chain),
                when,
                examples.get(cls.__name__, "-"),
            )
        )
    return markdown(("error", "is a", "raised for", "what it said here"), rows)


# -- accuracy --------------------------------------------------------------------------------


def load_result(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def accuracy_summary(report: dict[str, Any], split: str) -> Any:
    """One split's summary of an accuracy report: per metric and source, the runs judged, the
    median, worst and signed median error, and how many within the report's bound."""
    within = report["within"]
    rows = [
        (
            s["metric"],
            "**all**" if s["source"] == "all" else s["source"],
            s["count"],
            percent(s["median"]),
            percent(s["worst"]),
            percent(s["signed_median"], signed=True),
            f"{s['within']} of {s['count']}",
            s["misfits"] or "",
        )
        for s in report["summary"]
        if s["split"] == split
    ]
    return markdown(
        (
            "metric",
            "source",
            "runs",
            "median error",
            "worst",
            "signed median",
            f"within {within:.0%}",
            "misfits",
        ),
        rows,
    )


def accuracy_runs(report: dict[str, Any], split: str) -> Any:
    """Every run of one split: predicted against measured, and the error."""
    rows = []
    for r in report["runs"]:
        if r["split"] != split:
            continue
        if r.get("predicted") is None:
            predicted, error = "misfit", r.get("misfit") or ""
        else:
            predicted = f"{r['predicted']:,.4g}"
            error = percent(r["predicted"] / r["measured"] - 1, signed=True)
            if r.get("misfit"):
                error += f" (called a misfit: {r['misfit']})"
        note = r.get("instead")
        rows.append(
            (
                r["run"] + (f" (planned with {note})" if note else ""),
                r["metric"],
                r["unit"],
                predicted,
                f"{r['measured']:,.4g}",
                error,
                r.get("by") or "",
            )
        )
    return markdown(("run", "metric", "unit", "predicted", "measured", "error", "by"), rows)


# -- models and strategies -------------------------------------------------------------------


def unjudged_runs(records: Iterable[dict[str, Any]]) -> Any:
    """The published runs a benchmark lists and does not judge: the run, its measured step
    where it has one, and why (the benchmark's own words)."""
    rows = [
        (r["run"], "-" if r["measured"] is None else f"{r['measured']:.3g} s", r["why"])
        for r in records
    ]
    return markdown(("run", "measured step", "why it is not judged"), rows)


def model_presets() -> Any:
    """The model presets with their parameter counts and where their shapes come from."""
    import shardscope

    def billions(x: float | None) -> str:
        if not x:
            return "-"
        return f"{x / 1e9:,.1f}B" if x >= 1e9 else f"{x / 1e6:,.1f}M"

    rows = []
    for name, p in shardscope.MODEL_PRESETS.items():
        experts = f"{p.experts} (top {p.top_k})" if p.experts else "-"
        rows.append(
            (
                f"`{name}`",
                billions(p.param_count()),
                billions(p.active_param_count()) if p.experts else "",
                p.layers,
                p.d_model,
                f"{p.heads} / {p.kv_heads or p.heads}",
                experts,
                p.source,
            )
        )
    return markdown(
        ("preset", "parameters", "active", "layers", "d_model", "heads / kv", "experts", "source"),
        rows,
    )


def strategies(names: Iterable[str] | None = None) -> Any:
    """The named strategies: what each places where, and whether it has a shard_map twin."""
    import shardscope

    rows = []
    for name in names or shardscope.STRATEGIES:
        s = shardscope.get_strategy(name)
        rows.append((f"`{name}`", s.summary, "yes" if s.twin else ""))
    return markdown(("strategy", "what it does", "shard_map twin"), rows)


def remat_policies() -> Any:
    """Every recomputation policy by name: the decoder's tensors it keeps on the device, those
    it offloads, those it recomputes, and where its definition comes from."""
    from shardscope._src.model.remat import POLICY_NAMES, remat_policy

    rows = []
    for name in POLICY_NAMES:
        p = remat_policy(name)
        read = name if p.name == name else f"{name} (read as {p.name})"
        device, again = ", ".join(p.on_device), ", ".join(p.recomputed) or "-"
        if p.keeps_everything:  # none, selective: Table 2's activations, named or not
            device = "every activation the backward reads"
            again = "-" if p.recomputes_nothing else "the attention scores and probabilities"
        rows.append((read, device, ", ".join(p.offloaded) or "-", again, p.source))
    return markdown(("policy", "on the device", "offloaded", "recomputed", "from"), rows)


def remat_tensors() -> Any:
    """The reference decoder's named tensors, what each is, and its elements per token."""
    from shardscope._src.model.remat import TENSORS

    sizes = {
        "decoder_layer_input": "h",
        "pre_self_attention_norm": "h",
        "query_proj": "heads x head_dim / t",
        "key_proj": "kv_heads x head_dim / t",
        "value_proj": "kv_heads x head_dim / t",
        "context": "heads x head_dim / t",
        "out_proj": "h",
        "post_self_attention_norm": "h",
        "expert_input": "cf k x h (a layer with experts; none in a dense one)",
        "mlpwi_0": "ff / t (a layer with experts: (cf k + shared) x expert_ff / t)",
        "mlpwi_1": "as mlpwi_0 (SwiGLU); none (GELU)",
        "mlp_act": "ff / t (a layer with experts: the shared experts' expert_ff / t each)",
        "expert_act": "cf k x expert_ff / t (a layer with experts; none in a dense one)",
        "mlpwo": "h",
    }
    return markdown(("tensor", "what it is", "elements per token"),
                    [(n, what, sizes[n]) for n, what in TENSORS.items()])  # fmt: skip
