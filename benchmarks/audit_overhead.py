"""How much the collective audit adds to compiling a realistic program.

Compiles a 32-layer scanned transformer train step (lax.scan over stacked layers; attention
and MLP tensor-parallel over 8 simulated CPU devices, Megatron-style) from ShapeDtypeStructs,
then audits the compiled program (as_text, parse, analysis, memory and cost queries). Prints
the median of several runs of each and their ratio; the target is analysis <= 10% of compile.

    .venv/bin/python benchmarks/audit_overhead.py [--layers 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import shardscope

shardscope.use_cpu_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def train_step_program(
    layers: int, d: int = 256, heads: int = 8, seq: int = 128, batch: int = 8, vocab: int = 2048
):
    """A jitted train step and its ShapeDtypeStruct arguments on mesh model=8."""
    mesh = shardscope.make_mesh("model=8", axis_types="auto")
    hd = d // heads

    def sds(shape, spec, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    params = {
        "embed": sds((vocab, d), P()),
        "wq": sds((layers, d, heads, hd), P(None, None, "model", None)),
        "wk": sds((layers, d, heads, hd), P(None, None, "model", None)),
        "wv": sds((layers, d, heads, hd), P(None, None, "model", None)),
        "wo": sds((layers, heads, hd, d), P(None, "model", None, None)),
        "w1": sds((layers, d, 4 * d), P(None, None, "model")),
        "w2": sds((layers, 4 * d, d), P(None, "model", None)),
        "ln": sds((layers, 2, d), P()),
    }
    tokens = sds((batch, seq), P(), jnp.int32)

    def norm(x, g):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g

    def layer(x, p):
        wq, wk, wv, wo, w1, w2, ln = p
        h = norm(x, ln[0])
        q, k, v = (jnp.einsum("bsd,dhk->bshk", h, w) for w in (wq, wk, wv))
        att = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) / hd**0.5, axis=-1)
        x = x + jnp.einsum("bhqs,bshk,hkd->bqd", att, v, wo)
        h = norm(x, ln[1])
        return x + jax.nn.gelu(h @ w1) @ w2, None

    def loss(params, tokens):
        x = params["embed"][tokens]
        stacked = tuple(params[k] for k in ("wq", "wk", "wv", "wo", "w1", "w2", "ln"))
        x, _ = jax.lax.scan(layer, x, stacked)
        logits = x @ params["embed"].T
        logp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    def train_step(params, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        return value, jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    return train_step, (params, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    fn, example = train_step_program(args.layers)
    compile_s, audit_s = [], []
    result = None
    for _ in range(args.repeats):
        # A fresh jit each time, so no compiled executable is reused from JAX's caches.
        lowered = jax.jit(lambda p, t, fn=fn: fn(p, t)).lower(*example)
        t0 = time.perf_counter()
        compiled = lowered.compile()
        t1 = time.perf_counter()
        result = shardscope.audit(compiled)
        t2 = time.perf_counter()
        compile_s.append(t1 - t0)
        audit_s.append(t2 - t1)
    assert result is not None
    c, a = statistics.median(compile_s), statistics.median(audit_s)
    text = result.compiled.as_text()
    print(f"program: {args.layers}-layer scanned transformer train step, TP over model=8")
    print(f"HLO: {len(text.splitlines())} lines, {len(text) // 1024} KiB")
    counts = {k: v for k, v in result.counts().items() if v}
    print(f"collectives per step: {counts} ({len(result.collectives)} instructions)")
    print(f"compile  (median of {args.repeats}): {c * 1e3:8.1f} ms")
    print(
        f"audit    (median of {args.repeats}): {a * 1e3:8.1f} ms  "
        f"(as_text + parse + analysis + memory/cost queries)"
    )
    print(f"audit / compile: {a / c:.1%}  (target <= 10%)")


if __name__ == "__main__":
    main()
