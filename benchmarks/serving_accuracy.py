"""The serving model's error table: ``serve()``'s time per output token and time to the first
token against published measured runs, per metric, the calibration rows
(``../shared/CALIBRATION.md`` sets 4 and 5) apart from the runs it was never calibrated on.

For each metric: how many runs, the median and worst error, the signed median (a model that is
always fast is wrong even where its median error looks small) and how many land within 25%.

A run is planned as it ran: its model, GPUs, tensor-parallel degree, weights and load: a
static batch, clients in a closed loop (``clients=``: each sends its next request when its
last one ends) or a request rate (``rate=``); its time per output token and to the first
token are those its requests see under that load (the decode step over a cache of the
whole prompt and output: the last step, where a run measures the mean over its steps), on
the serving engine it ran on (its host's time a step and a request, ``engine=``). A run the
plans call a misfit is counted apart.

Run: ``python benchmarks/serving_accuracy.py`` (each run compiled with its hardware's own
compiler, deviceless: minutes), or ``--compiler cpu`` for the estimates alone (seconds);
``--engine none`` plans every run on the device's time alone, without its engine's host.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from typing import NamedTuple

from shardscope import PlanError, ServePlan, serve


class Run(NamedTuple):
    """A published serving run: ``source`` names it, ``engine`` the serving engine it ran on
    (as its source says: a preset of ``shardscope``'s engines); ``given`` its measured
    milliseconds."""

    source: str
    engine: str
    model: str
    hardware: str
    tp: int
    weights: str
    prompt: int
    output: int
    batch: int
    metric: str  # "token": time per output token; "first": time to the first token
    given: float
    #: how the run loaded the server: ``batch`` clients in a closed loop, or (``rate``)
    #: requests a second arriving at random; neither: a static batch of ``batch``
    closed: bool = False
    rate: float | None = None

    @property
    def load(self) -> str:
        """The run's load in words."""
        if self.rate is not None:
            return f"{self.rate:g}/s"
        return f"{'c' if self.closed else 'b'}{self.batch}"


#: CALIBRATION.md set 4 (TensorRT-LLM 0.14, online at 2 requests/s) and set 5 (vLLM, Llama 3.1
#: 70B fp8, 4 clients in a closed loop, input 1024 or 8192, output 1024).
CALIBRATION = (
    Run("TensorRT-LLM 0.14, 2 req/s", "tensorrt-llm", "llama3-8b", "h100", 1, "bfloat16", 467,
        256, 1, "token", 8, rate=2),
    Run("TensorRT-LLM 0.14, 2 req/s", "tensorrt-llm", "llama3-8b", "h100", 1, "bfloat16", 467,
        256, 1, "first", 23, rate=2),
    *(
        Run("vLLM, 4 clients", "vllm", "llama3-70b", "h100", tp, "fp8", prompt, 1024, 4, metric,
            ms, closed=True)
        for tp, prompt, token, first in ((2, 1024, 17.41, 121.3), (4, 1024, 11.78, 80.5),
                                         (8, 1024, 9.11, 70.4), (8, 8192, 10.22, 300.8))
        for metric, ms in (("token", token), ("first", first))
    ),
)  # fmt: skip

#: Measured runs the serving model was not calibrated on, each with its source.
HELD_OUT = (
    # torchao README (pytorch/ao, torchao/quantization), H100 and A100-80GB tables:
    # generate.py --compile, batch 1, bfloat16: 126.90, 95.64 and 107.38 tokens/s (gpt-fast's
    # generate loop: torch.compile, the step one CUDA graph)
    Run("torchao", "gpt-fast", "llama3-8b", "h100", 1, "bfloat16", 5, 200, 1, "token",
        1e3 / 126.90),
    Run("torchao", "gpt-fast", "llama3-8b", "a100", 1, "bfloat16", 5, 200, 1, "token",
        1e3 / 95.64),
    Run("torchao", "gpt-fast", "llama2-7b", "a100", 1, "bfloat16", 5, 200, 1, "token",
        1e3 / 107.38),
    # gpt-fast README (pytorch-labs/gpt-fast@0f925b5), A100-80GB at 330 W, batch 1, bfloat16,
    # tensor parallel over 1-8: Llama 2 7B 104.9 / 168.84 / 254.02 / 328.43 tokens/s, 70B
    # over 2-8 21.32 / 38.01 / 62.5 tokens/s
    *(
        Run("gpt-fast", "gpt-fast", "llama2-7b", "a100", tp, "bfloat16", 5, 200, 1, "token",
            1e3 / tps)
        for tp, tps in ((1, 104.9), (2, 168.84), (4, 254.02), (8, 328.43))
    ),
    *(
        Run("gpt-fast", "gpt-fast", "llama2-70b", "a100", tp, "bfloat16", 5, 200, 1, "token",
            1e3 / tps)
        for tp, tps in ((2, 21.32), (4, 38.01), (8, 62.5))
    ),
    # LMDeploy's A100 fp16 benchmark (InternLM/lmdeploy@3e391df, docs/en/benchmark/
    # a100_fp16.md, TurboMind v0.1.0a1, batch clients in a closed loop): first-token latency
    # (ave) and the median per-token latency, rounded to the millisecond
    *(
        Run("LMDeploy v0.1", "lmdeploy", model, "a100", tp, "bfloat16", prompt, output, batch,
            metric, ms, closed=True)
        for model, tp, prompt, output, batch, metric, ms in (
            ("llama2-7b", 1, 128, 128, 1, "first", 22),
            ("llama2-7b", 1, 128, 128, 1, "token", 10),
            ("llama2-7b", 1, 2048, 2048, 1, "first", 140),
            ("llama2-7b", 1, 2048, 2048, 1, "token", 11),
            ("llama2-7b", 1, 128, 2048, 16, "token", 15),
            ("llama2-7b", 1, 128, 2048, 64, "token", 30),
            ("llama2-13b", 1, 128, 128, 1, "first", 40),
            ("llama2-13b", 1, 128, 128, 1, "token", 17),
            ("llama2-13b", 1, 2048, 2048, 1, "first", 243),
            ("llama2-13b", 1, 2048, 2048, 1, "token", 19),
            ("llama2-13b", 1, 128, 2048, 16, "token", 26),
            ("llama2-70b", 4, 128, 128, 1, "first", 74),
            ("llama2-70b", 4, 128, 128, 1, "token", 29),
            ("llama2-70b", 4, 2048, 2048, 1, "first", 405),
            ("llama2-70b", 4, 2048, 2048, 1, "token", 31),
            ("llama2-70b", 4, 128, 2048, 16, "token", 33),
            ("llama2-70b", 4, 128, 2048, 64, "token", 43),
        )
    ),
    # NVIDIA NIM 1.8 benchmarking page (docs.nvidia.com/nim/benchmarking/llm), Llama 3.3 70B
    # fp8 on 2 H100s, clients in a closed loop: inter-token latency and, one client, TTFT (NIM's
    # LLM containers run TensorRT-LLM)
    *(
        Run(f"NIM 1.8, {n} client{'s' * (n > 1)}", "tensorrt-llm", "llama3-70b", "h100", 2,
            "fp8", prompt, output, n, metric, ms, closed=True)
        for n, prompt, output, metric, ms in (
            (1, 5000, 500, "token", 18.58),
            (1, 5000, 500, "first", 406.77),
            (1, 500, 2000, "token", 18.91),
            (1, 500, 2000, "first", 47.77),
            (5, 5000, 500, "token", 21.83),
            (25, 5000, 500, "token", 38.75),
        )
    ),
    # TensorRT-LLM v0.5 docs/source/performance.md, low latency: the first token at batch 1
    # (one output token), A100 fp16 (planned in bfloat16: the same bytes and rate), H100 fp8
    *(
        Run(f"TensorRT-LLM v0.5, {hw}", "tensorrt-llm", model, hw, tp, weights, prompt, 1, 1,
            "first", ms)
        for hw, weights, model, tp, prompt, ms in (
            ("a100", "bfloat16", "llama2-7b", 1, 128, 16),
            ("a100", "bfloat16", "llama2-7b", 1, 2048, 133),
            ("a100", "bfloat16", "llama2-70b", 4, 128, 47),
            ("a100", "bfloat16", "llama2-70b", 4, 2048, 377),
            ("h100", "fp8", "llama2-7b", 1, 128, 7),
            ("h100", "fp8", "llama2-7b", 1, 2048, 36),
            ("h100", "fp8", "llama2-70b", 4, 128, 26),
            ("h100", "fp8", "llama2-70b", 4, 2048, 109),
        )
    ),
)  # fmt: skip


#: What the serving simulators that publish an error table report, to read beside this one's
#: (theirs measured on their own runs, against models profiled on the GPU they predict).
PEERS = (
    "Vidur (Agrawal et al., MLSys 2024, arXiv 2405.05465): request latency under 9% error "
    "against vLLM and Sarathi-Serve runs on A100 and H100, each model's operators profiled "
    "on that GPU first",
)


@functools.cache
def _plan(run: Run, compiler: str | None, engine: str | None = None) -> ServePlan:
    """The plan of ``run``'s layout under its load on its engine (or ``engine``), planned
    once for both of its metrics."""
    if run.rate is not None:
        load: dict[str, float] = {"rate": run.rate}
    else:
        load = {"clients" if run.closed else "batch": run.batch}
    result = serve(
        run.model, run.tp, hardware=run.hardware, prompt=run.prompt, output=run.output,
        weights=run.weights, compiler=compiler, engine=engine or run.engine, **load,
    )  # fmt: skip
    return next(p for p in result.plans if dict(p.mesh) == {"model": run.tp})


def predicted_ms(run: Run, compiler: str | None, engine: str | None = None) -> tuple[float, str]:
    """The plan's milliseconds for ``run``'s metric on its engine (or ``engine``), and what
    produced them."""
    plan = _plan(run._replace(metric="", given=0.0), compiler, engine)
    seconds = plan.decode_step_s if run.metric == "token" else plan.first_token_s
    return seconds * 1e3, plan.compiled_by or "estimate"


def judge(
    title: str, runs: tuple[Run, ...], compiler: str | None, engine: str | None = None
) -> None:
    """Prints each run's error and the summary of each metric."""
    print(title)
    errors: dict[str, list[float]] = {"token": [], "first": []}
    misfits = 0
    for run in runs:
        what = f"{run.source}: {run.model} TP {run.tp} {run.weights} {run.prompt}+{run.output}"
        try:
            got, by = predicted_ms(run, compiler, engine)
        except PlanError as e:
            misfits += 1
            print(f"  {what:62} {run.load:5} {run.metric:5} called a misfit: {e}")
            continue
        error = got / run.given - 1
        errors[run.metric].append(error)
        print(f"  {what:62} {run.load:5} {run.metric:5} {got:8.2f} ms  given "
              f"{run.given:8.2f}  {error:+7.1%}  ({by}, {engine or run.engine})")  # fmt: skip
    for metric, name in (("token", "time per output token"), ("first", "time to first token")):
        e = errors[metric]
        if not e:
            continue
        size = sorted(abs(x) for x in e)
        print(
            f"  {name}: {len(e)} runs, median |error| {statistics.median(size):.1%}, signed "
            f"median {statistics.median(e):+.1%}, worst {size[-1]:.1%}, "
            f"{sum(x <= 0.25 for x in size)} within 25%"
        )
    if misfits:
        print(f"  {misfits} runs that ran called misfits")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiler", default=None, help="cpu: the estimates alone")
    parser.add_argument(
        "--engine", default=None, help="every run on this engine (none: the device's time alone)"
    )
    args = parser.parse_args()
    at = (args.compiler, args.engine)
    judge("calibration rows (CALIBRATION.md sets 4 and 5):", CALIBRATION, *at)
    judge("held-out runs (judged, not calibrated on):", HELD_OUT, *at)
    print("published by peers, for comparison:")
    for line in PEERS:
        print(f"  {line}")


if __name__ == "__main__":
    main()
