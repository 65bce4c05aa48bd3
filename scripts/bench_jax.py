"""Faultline's functional training step side by side with a jitted JAX step, one core each.

For each model (batch 32): Faultline's step in bf16 and fp32 (`faultline train`, functional
mode), and the same model in JAX, fp32, the whole step (forward, gradient, SGD update) under
one `jax.jit`. The JAX model is built from the same RON file by a small parser of the RON the
model files use, so the two sides cannot drift: same layers and shapes, Glorot-uniform weights,
softmax cross-entropy, plain SGD at the learning rate Faultline reports.

How each cell is measured (one core: this process and every `faultline` it runs are pinned to
--cpu; XLA's and the BLAS libraries' thread pools are set to one thread):
* Faultline: two runs of `faultline train --steps N1` and `--steps N2` (N1 sized for about
  --target seconds and at least 2, N2 = 3 N1) each round; per step = (min wall(N2) - min
  wall(N1)) / (N2 - N1), the mins over the rounds, where wall is the `wall_seconds` of
  `train --json` (the step loop and the final test evaluation, which the difference cancels,
  as it cancels the process's setup and the first step's extra cost).
* JAX: compiled and warmed up once; then K steps (K sized for about --target seconds) back to
  back, params donated, timed to `block_until_ready`; per step = time / K. Python dispatch
  is included, as it is in any JAX training loop.
* Rounds interleave the tools (each round runs every model's cells, alternating the order);
  each cell is the minimum over the rounds (for Faultline, of each of the two runs).
MACs/step: the products of the step's MXU GEMM shapes (M x K x N) in `faultline program
--json`: forward and backward, as lowered (no gradient for the model input).

Before timing, each model's first runs are checked: `faultline train` exits 0 with finite
losses, and the JAX step gives finite losses.

Usage: bench_jax.py [--faultline BIN] [--models a,b] [--rounds N] [--cpu C] [--write]
"""

import argparse
import datetime
import gc
import math
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "src", "reference", "performance.md")
BEGIN, END = "<!-- bench-jax:begin -->", "<!-- bench-jax:end -->"
BATCH = 32

# key, label in the table, model file, config, data (None: the shipped dataset `train` picks;
# "uniform": images/features uniform in [0, 1); "tokens": one-hot token sequences), --lr
# (None: train's default). The bench models run at a small learning rate so that 20-layer
# nets without normalisation stay finite on random data.
MODELS = [
    ("mlp-digits", "mlp-digits", "models/mlp-digits.ron", "tpu-32x32", None, None),
    ("cnn-small", "cnn-small", "models/cnn-small.ron", "tpu-32x32", None, None),
    ("transformer-tiny", "transformer-tiny", "models/transformer-tiny.ron", "tpu-32x32", None, None),
    ("lenet-mnist", "lenet-mnist (LeNet-5, MNIST)", "models/lenet-mnist.ron", "tpu-128x128", None, 0.1),
    ("resnet-mini", "resnet-mini (ResNet-8 with BatchNorm, MNIST)", "models/resnet-mini.ron", "tpu-128x128", None, 0.1),
    ("gpt-mini", "gpt-mini (2 blocks, d=128, context 64, Shakespeare)", "models/gpt-mini.ron", "tpu-128x128", None, 0.003),
    ("mlp-784", "MLP 784-256-128-10", "scripts/bench/models/mlp-784.ron", "tpu-128x128", "uniform", 0.05),
    ("lenet", "LeNet-like, stride-2 convs, 28x28x1", "scripts/bench/models/lenet.ron", "tpu-32x32", "uniform", 0.05),
    ("cnn-16-32-64", "CNN 16-32-64 channels, 28x28x1", "scripts/bench/models/cnn-16-32-64.ron", "tpu-32x32", "uniform", 0.05),
    ("transformer-d64", "transformer d=64, seq 32, ff 256", "scripts/bench/models/transformer-d64.ron", "tpu-32x32", "tokens", 0.05),
    ("resnet20", "ResNet-20 without BN, 32x32x3", "scripts/bench/models/resnet20.ron", "tpu-128x128", "uniform", 0.01),
]
TRAIN_SAMPLES, TEST_SAMPLES = 512, 32


def say(*a):
    print("bench-jax:", *a, file=sys.stderr, flush=True)


def fail(msg):
    say("error:", msg)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# RON: the subset the model files use (structs, named-field and unit enum variants, lists,
# strings, numbers, booleans, // and /* */ comments). A struct or variant becomes a dict, a
# variant's name is under "_variant"; a unit variant is its name as a string.

_TOKEN = re.compile(
    r'\s+|//[^\n]*|/\*.*?\*/|(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+))'
    r"|(?P<id>[A-Za-z_][A-Za-z0-9_]*)|(?P<p>[()\[\]:,])",
    re.S,
)


def parse_ron(text, file="<ron>"):
    toks, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            fail(f"{file}: cannot read RON at {text[pos:pos + 20]!r}")
        pos = m.end()
        if m.group("str"):
            toks.append(("str", bytes(m.group("str")[1:-1], "utf-8").decode("unicode_escape")))
        elif m.group("num"):
            s = m.group("num")
            toks.append(("num", float(s) if re.search(r"[.eE]", s) else int(s)))
        elif m.group("id"):
            toks.append(("id", m.group("id")))
        elif m.group("p"):
            toks.append(("p", m.group("p")))
    i = 0

    def peek(k=0):
        return toks[i + k] if i + k < len(toks) else ("eof", None)

    def expect(p):
        nonlocal i
        if peek() != ("p", p):
            fail(f"{file}: expected {p!r}, found {peek()[1]!r}")
        i += 1

    def seq(close):
        # values or `name: value` fields up to `close`; returns (list, dict)
        nonlocal i
        vals, fields = [], {}
        while peek() != ("p", close):
            if peek()[0] == "id" and peek(1) == ("p", ":"):
                name = peek()[1]
                i += 2
                fields[name] = value()
            else:
                vals.append(value())
            if peek() == ("p", ","):
                i += 1
            elif peek() != ("p", close):
                fail(f"{file}: expected ',' or {close!r}, found {peek()[1]!r}")
        i += 1
        return vals, fields

    def value():
        nonlocal i
        kind, v = peek()
        i += 1
        if kind in ("str", "num"):
            return v
        if kind == "p" and v == "[":
            return seq("]")[0]
        if kind == "p" and v == "(":
            vals, fields = seq(")")
            return fields if fields or not vals else vals
        if kind == "id":
            if v in ("true", "false"):
                return v == "true"
            if peek() == ("p", "("):
                i += 1
                vals, fields = seq(")")
                if vals:
                    fail(f"{file}: variant {v} with unnamed fields is not in the supported subset")
                return {"_variant": v, **fields}
            return v
        fail(f"{file}: unexpected {v!r}")

    out = value()
    if peek()[0] != "eof":
        fail(f"{file}: trailing text after the model")
    return out


def load_spec(path):
    with open(path) as f:
        return parse_ron(f.read(), path)


# ---------------------------------------------------------------------------------------------
# The model in JAX, from the spec (sim/graph/src/spec.rs and build.rs: the same ops, shapes and
# initialisation families; the values need not match Faultline's, the work does).


def op_kind(op):
    return op if isinstance(op, str) else op["_variant"]


def build_jax(spec, seed):
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    params, plan = {}, []
    shapes = {"input": [BATCH] + list(spec["input"])}
    prev = "input"

    def glorot(shape, fan_in, fan_out):
        lim = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-lim, lim, shape).astype(np.float32)

    for layer in spec["layers"]:
        name, op = layer["name"], layer["op"]
        kind = op_kind(op)
        ins = layer.get("inputs") or [prev]
        xs = shapes[ins[0]]
        if kind == "Dense":
            k, units = xs[-1], op["units"]
            params[name + ".weight"] = glorot((k, units), k, units)
            if op.get("bias", True):
                params[name + ".bias"] = np.zeros(units, np.float32)
            out = xs[:-1] + [units]
        elif kind == "Conv2d":
            f, k, s, p = op["filters"], op["kernel"], op.get("stride", 1), op.get("padding", 0)
            _, h, w, c = xs
            params[name + ".weight"] = glorot((k, k, c, f), k * k * c, f)
            if op.get("bias", True):
                params[name + ".bias"] = np.zeros(f, np.float32)
            out = [xs[0], (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1, f]
        elif kind in ("MaxPool", "AvgPool"):
            k, p = op["size"], op.get("padding", 0)
            s = op.get("stride") or k
            out = [xs[0], (xs[1] + 2 * p - k) // s + 1, (xs[2] + 2 * p - k) // s + 1, xs[3]]
        elif kind == "GlobalAvgPool":
            out = [xs[0], xs[3]]
        elif kind in ("Relu", "Gelu", "Silu", "Softmax", "Add", "Mul", "Attention"):
            out = list(xs)
        elif kind == "RmsNorm":
            params[name + ".gamma"] = np.ones(xs[-1], np.float32)
            out = list(xs)
        elif kind in ("LayerNorm", "BatchNorm"):
            params[name + ".gamma"] = np.ones(xs[-1], np.float32)
            params[name + ".beta"] = np.zeros(xs[-1], np.float32)
            out = list(xs)
        elif kind == "Flatten":
            out = [xs[0], math.prod(xs[1:])]
        elif kind == "Reshape":
            out = [xs[0]] + list(op["shape"])
            if math.prod(out) != math.prod(xs):
                fail(f"{spec['name']}: layer {name}: Reshape {xs} -> {out}")
        elif kind == "Embedding":
            params[name + ".table"] = rng.uniform(-0.1, 0.1, (op["vocab"], op["dim"])).astype(np.float32)
            out = list(xs) + [op["dim"]]
        elif kind == "TiedOutput":
            out = list(xs[:-1]) + [params[op["embedding"] + ".table"].shape[0]]
        elif kind == "Positional":
            params[name + ".table"] = rng.uniform(-0.1, 0.1, xs[1:]).astype(np.float32)
            out = list(xs)
        elif kind == "MeanPool":
            out = [xs[0], xs[2]]
        else:
            fail(f"{spec['name']}: layer {name}: op {kind} is not in bench_jax.py's model builder")
        shapes[name] = out
        plan.append((name, kind, op, ins))
        prev = name
    if spec["loss"] not in ("SoftmaxCrossEntropy", "TokenCrossEntropy"):
        fail(f"{spec['name']}: loss {spec['loss']}: only the cross-entropies are built")
    want = [BATCH] + ([spec["input"][0]] if spec["loss"] == "TokenCrossEntropy" else []) + [spec["outputs"]]
    if shapes[prev] != want:
        fail(f"{spec['name']}: output {shapes[prev]}, expected {want}")

    def forward(pr, x):
        v = {"input": x}
        for name, kind, op, ins in plan:
            a = v[ins[0]]
            if kind == "Dense":
                y = a @ pr[name + ".weight"]
                if name + ".bias" in pr:
                    y = y + pr[name + ".bias"]
            elif kind == "Conv2d":
                s, p = op.get("stride", 1), op.get("padding", 0)
                y = jax.lax.conv_general_dilated(
                    a, pr[name + ".weight"], (s, s), [(p, p), (p, p)], dimension_numbers=("NHWC", "HWIO", "NHWC")
                )
                if name + ".bias" in pr:
                    y = y + pr[name + ".bias"]
            elif kind in ("MaxPool", "AvgPool"):
                k, p = op["size"], op.get("padding", 0)
                s = op.get("stride") or k
                pads = [(0, 0), (p, p), (p, p), (0, 0)]
                if kind == "MaxPool":
                    y = jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (1, k, k, 1), (1, s, s, 1), pads)
                else:
                    y = jax.lax.reduce_window(a, 0.0, jax.lax.add, (1, k, k, 1), (1, s, s, 1), pads) / (k * k)
            elif kind == "GlobalAvgPool":
                y = a.mean(axis=(1, 2))
            elif kind == "Relu":
                y = jax.nn.relu(a)
            elif kind == "Gelu":
                y = jax.nn.gelu(a, approximate=True)
            elif kind == "Silu":
                y = jax.nn.silu(a)
            elif kind == "Mul":
                y = a * v[ins[1]]
            elif kind == "RmsNorm":
                y = a * jax.lax.rsqrt((a * a).mean(-1, keepdims=True) + op.get("eps", 1e-5)) * pr[name + ".gamma"]
            elif kind == "Softmax":
                y = jax.nn.softmax(a, axis=-1)
            elif kind == "LayerNorm":
                mean = a.mean(-1, keepdims=True)
                var = ((a - mean) ** 2).mean(-1, keepdims=True)
                y = (a - mean) * jax.lax.rsqrt(var + op.get("eps", 1e-5)) * pr[name + ".gamma"] + pr[name + ".beta"]
            elif kind == "BatchNorm":
                # Training mode: the batch's statistics over every axis but the channels (the
                # running estimates' update, a few [C] vectors, is left out of the timing).
                axes = tuple(range(a.ndim - 1))
                mean = a.mean(axes)
                var = ((a - mean) ** 2).mean(axes)
                y = (a - mean) * jax.lax.rsqrt(var + op.get("eps", 1e-5)) * pr[name + ".gamma"] + pr[name + ".beta"]
            elif kind in ("Flatten", "Reshape"):
                y = a.reshape(shapes[name])
            elif kind == "Add":
                y = a + v[ins[1]]
            elif kind == "Embedding":
                y = pr[name + ".table"][a.astype(jnp.int32)]
            elif kind == "TiedOutput":
                y = a @ pr[op["embedding"] + ".table"].T
            elif kind == "Positional":
                y = a + pr[name + ".table"]
            elif kind == "Attention":
                q, k, vv = a, v[ins[1]], v[ins[2]]
                n, t, d = q.shape
                h = op.get("heads", 1) if isinstance(op, dict) else 1
                split = lambda z: z.reshape(n, t, h, d // h)
                scores = jnp.einsum("bthd,bshd->bhts", split(q), split(k)) * (1.0 / math.sqrt(d // h))
                if isinstance(op, dict) and op.get("causal", False):
                    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
                p = jax.nn.softmax(scores, axis=-1)
                y = jnp.einsum("bhts,bshd->bthd", p, split(vv)).reshape(n, t, d)
            elif kind == "MeanPool":
                y = a.mean(axis=1)
            v[name] = y
        return v[plan[-1][0]]

    def loss_fn(pr, x, onehot):
        return -(jax.nn.log_softmax(forward(pr, x), axis=-1) * onehot).sum(-1).mean()

    return params, loss_fn, shapes["input"]


class JaxStep:
    """One model's jitted train step, its state, and a timer."""

    def __init__(self, spec, lr, seed=1):
        import jax
        import jax.numpy as jnp
        import numpy as np

        self.jax = jax
        params, loss_fn, in_shape = build_jax(spec, seed)

        def step(pr, x, onehot):
            loss, g = jax.value_and_grad(loss_fn)(pr, x, onehot)
            return jax.tree_util.tree_map(lambda p, d: p - lr * d, pr, g), loss

        self.step = jax.jit(step, donate_argnums=0)
        rng = np.random.default_rng(seed)
        first = spec["layers"][0]["op"]
        if op_kind(first) == "Embedding":
            # Token ids, as Faultline's Embedding reads them (floats holding integers).
            self.x = jnp.asarray(rng.integers(0, first["vocab"], in_shape).astype(np.float32))
        else:
            self.x = jnp.asarray(rng.uniform(0, 1, in_shape).astype(np.float32))
        per = [spec["input"][0]] if spec["loss"] == "TokenCrossEntropy" else []
        labels = rng.integers(0, spec["outputs"], [BATCH] + per)
        self.y = jnp.asarray(np.eye(spec["outputs"], dtype=np.float32)[labels])
        self.params = jax.device_put(params)
        t = time.perf_counter()
        losses = [float(self.run(1)[1]) for _ in range(3)]  # compiles, warms up
        self.compile_seconds = time.perf_counter() - t
        if not all(math.isfinite(v) for v in losses):
            fail(f"{spec['name']}: the JAX step's loss is not finite: {losses}")
        self.first_losses = losses

    def run(self, n):
        """n steps back to back; returns (seconds, last loss)."""
        p, loss = self.params, None
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            for _ in range(n):
                p, loss = self.step(p, self.x, self.y)
            self.jax.block_until_ready((p, loss))
            dt = time.perf_counter() - t
        finally:
            gc.enable()
        self.params = p
        return dt, loss


# ---------------------------------------------------------------------------------------------
# Faultline


def train_cmd(args, m, steps, precision):
    key, _, ron, config, data, lr = m
    cmd = ["taskset", "-c", str(args.cpu), args.faultline, "train", "--model", ron, "--config", f"configs/{config}.ron"]
    cmd += ["--batch", str(BATCH), "--precision", precision, "--eval-every", "0", "--steps", str(steps), "--json"]
    if data:
        cmd += ["--data", data_dir(key)]
    if lr is not None:
        cmd += ["--lr", str(lr)]
    return cmd


def fl_train(args, m, steps, precision):
    """Runs `faultline train`; returns (seconds of the step loop + final evaluation, summary)."""
    import json

    cmd = train_cmd(args, m, steps, precision)
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr}")
    s = json.loads(r.stdout)
    losses = [float(v) for v in s["losses"]]
    if not all(math.isfinite(v) for v in losses):
        fail(f"{m[0]} {precision}: faultline train gave a non-finite loss ({' '.join(cmd)})")
    return s.get("wall_seconds", wall), s


def macs_per_step(args, m):
    import json

    _, _, ron, config, _, _ = m
    cmd = [args.faultline, "program", "--model", ron, "--config", f"configs/{config}.ron", "--batch", str(BATCH), "--json"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr}")
    return sum(math.prod(int(d) for d in i["shape"].split("x")) for i in json.loads(r.stdout)["instructions"] if i["unit"] == "mxu")


# ---------------------------------------------------------------------------------------------
# Data for the bench models: seeded random inputs, labels from a random linear teacher (so the
# task is learnable and `train` can be seen to learn it); x_test/y_test keep the final
# evaluation, which every run pays once, small.


def data_dir(key):
    return os.path.join(ROOT, "target", "bench-data", key)


def write_data(m, spec):
    import numpy as np

    key, _, _, _, data, _ = m
    d = data_dir(key)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(27)
    n, shape = TRAIN_SAMPLES + TEST_SAMPLES, list(spec["input"])
    if data == "tokens":
        t, vocab = shape
        x = np.eye(vocab, dtype=np.float32)[rng.integers(0, vocab, (n, t))]
    else:
        x = rng.uniform(0, 1, [n] + shape).astype(np.float32)
    teacher = rng.standard_normal((math.prod(shape), spec["outputs"])).astype(np.float32)
    flat = x.reshape(n, -1)
    y = np.argmax((flat - flat.mean(0)) @ teacher, axis=1).astype(np.int64)
    for name, a in [("x", x[:TRAIN_SAMPLES]), ("y", y[:TRAIN_SAMPLES]), ("x_test", x[TRAIN_SAMPLES:]), ("y_test", y[TRAIN_SAMPLES:])]:
        np.save(os.path.join(d, name + ".npy"), a)


# ---------------------------------------------------------------------------------------------


def fmt_time(s):
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale or unit == "µs":
            return f"{s / scale:.3g} {unit}"


def fmt_macs(n):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2g} {unit}" if n / scale < 10 else f"{n / scale:.0f} {unit}"
    return str(n)


def fmt_ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}"


def table(rows):
    out = [
        "| model | MACs/step | Faultline bf16 step | Faultline fp32 step | JAX jit fp32 step | fp32 / JAX | bf16 / JAX |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for m, macs, best in rows:
        label = m[1] + (f" ({m[3]})" if m[3] != "tpu-32x32" else "")
        bf, fp, jx = best["bf16"], best["fp32"], best["jax"]
        out.append(
            f"| {label} | {fmt_macs(macs)} | {fmt_time(bf)} | {fmt_time(fp)} | {fmt_time(jx)} "
            f"| {fmt_ratio(fp, jx)} | {fmt_ratio(bf, jx)} |"
        )
    return "\n".join(out)


def git(*a, cwd):
    r = subprocess.run(["git", *a], cwd=cwd, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def sgemm_rate():
    """numpy's (OpenBLAS's) single-thread fp32 GEMM on this core, 512^3, in MAC/s: the machine's scale."""
    import numpy as np

    a = np.random.default_rng(0).uniform(-1, 1, (512, 512)).astype(np.float32)
    for _ in range(3):
        a @ a
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(10):
            a @ a
        best = min(best, (time.perf_counter() - t) / 10)
    return 512**3 / best


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError):
        return math.nan


def provenance(args, machine):
    bindir = os.path.dirname(os.path.realpath(args.faultline))
    commit = git("rev-parse", "--short", "HEAD", cwd=bindir)
    if commit:
        dirty = git("status", "--porcelain", "--untracked-files=no", cwd=bindir)
        commit += " (with uncommitted changes)" if dirty else ""
    else:
        commit = "an unknown commit (the binary is not in a git work tree)"
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        cpu = f"{names[0]} ({len(names)} logical CPUs)" if names else cpu
    except OSError:
        pass
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return (
        f"Measured on {date}, `faultline` from commit {commit}, jax {__import__('jax').__version__}, "
        f"on {cpu}, one core each ({machine}); min of {args.rounds} rounds, batch {BATCH}; "
        f"configs tpu-32x32 unless named."
    )


def write_doc(text):
    with open(DOC) as f:
        doc = f.read()
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        fail(f"{DOC}: needs one {BEGIN} ... {END} pair")
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    with open(DOC, "w") as f:
        f.write(doc[:a] + "\n" + text + "\n" + doc[b:])
    say(f"wrote the table into {os.path.relpath(DOC, ROOT)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faultline", default=os.path.join(ROOT, "target", "release", "faultline"), help="binary (no build)")
    ap.add_argument("--models", help="comma-separated keys: " + ",".join(m[0] for m in MODELS))
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; each cell is its min [5]")
    ap.add_argument("--cpu", type=int, default=0, help="the core everything is pinned to [0]")
    ap.add_argument("--target", type=float, default=0.3, help="seconds per timed run (N1 steps; JAX's K steps) [0.3]")
    ap.add_argument("--write", action="store_true", help=f"write the table into {os.path.relpath(DOC, ROOT)}")
    args = ap.parse_args()
    t_start = time.perf_counter()

    args.faultline = os.path.abspath(args.faultline)
    if not os.access(args.faultline, os.X_OK):
        fail(f"{args.faultline}: no such binary; build it (cargo build --release -p faultline-cli) or pass --faultline PATH")
    models = MODELS
    if args.models:
        keys = args.models.split(",")
        unknown = [k for k in keys if k not in [m[0] for m in MODELS]]
        if unknown:
            fail(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(m[0] for m in MODELS)}")
        models = [m for m in MODELS if m[0] in keys]
        if args.write:
            fail("--write writes the whole table: run it without --models")
    if args.rounds < 1:
        fail("--rounds must be at least 1")

    # One core, one thread: set before jax is imported (XLA reads its flags once).
    os.sched_setaffinity(0, {args.cpu})
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "XLA_CPU_NUM_THREADS"):
        os.environ[v] = "1"
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    say(f"jax {jax.__version__}, {args.faultline}, core {args.cpu}, {args.rounds} rounds")
    load0, sgemm = loadavg(), sgemm_rate()
    say(f"load average {load0:.2f}; numpy sgemm 512^3 on core {args.cpu}: {sgemm / 1e9:.0f} GMAC/s")

    # Setup, not timed: data, MACs, a checked first run of each tool, run lengths.
    setup = {}
    for m in models:
        key = m[0]
        spec = load_spec(os.path.join(ROOT, m[2]))
        if m[4]:
            write_data(m, spec)
        macs = macs_per_step(args, m)
        plan = {}
        for prec in ("fp32", "bf16"):
            w2, s = fl_train(args, m, 2, prec)
            # a rough per-step time (the 2-step run is mostly evaluation for small models),
            # then a better one by difference, over at least 8 more steps: a 1-step difference
            # of ResNet-20's ~0.5 s step drowned in noise once and asked for 3 M steps
            n = max(10, min(200000, int(args.target / max(w2 / 2, 1e-7))))
            wn, s2 = fl_train(args, m, n, prec)
            if wn <= w2:
                fail(f"{key} {prec}: {n} steps took {wn:.3f} s, no longer than 2 steps ({w2:.3f} s): the machine is too noisy to time")
            per = (wn - w2) / (n - 2)
            # N1 >= 2: a 2-step difference of a ~0.5 s step is too short to measure
            n1 = max(2, math.ceil(args.target / per))
            plan[prec] = (n1, 3 * n1)
            say(
                f"{key} {prec}: faultline train runs, loss {s2['losses'][0]:.4g} -> {s2['losses'][-1]:.4g} "
                f"over {n} steps (lr {s2['lr']}); ~{fmt_time(per)}/step, timing {n1} vs {3 * n1} steps"
            )
        lr = s2["lr"]
        js = JaxStep(spec, lr)
        dt, _ = js.run(10)
        k = max(10, math.ceil(args.target / (dt / 10)))
        say(
            f"{key} jax: compiled and warmed up in {js.compile_seconds:.2f} s, loss {js.first_losses[0]:.4g}; "
            f"~{fmt_time(dt / 10)}/step, timing {k} steps"
        )
        setup[key] = (macs, plan, js, k)

    # Faultline: the min over rounds of each run's wall time, N1 and N2 apart, then their
    # difference (the min of per-round differences would reward a round whose N1 run was slowed).
    walls = {m[0]: {p: [math.inf, math.inf] for p in ("bf16", "fp32")} for m in models}
    jax_best = {m[0]: math.inf for m in models}
    for r in range(args.rounds):
        for m in models:
            key = m[0]
            macs, plan, js, k = setup[key]
            cells = ["fp32", "bf16", "jax"]
            if (r + models.index(m)) % 2:
                cells.reverse()
            got = {}
            for c in cells:
                if c == "jax":
                    dt, loss = js.run(k)
                    if not math.isfinite(float(loss)):
                        fail(f"{key}: the JAX step's loss became non-finite")
                    got[c] = dt / k
                    jax_best[key] = min(jax_best[key], got[c])
                else:
                    n1, n2 = plan[c]
                    w1, _ = fl_train(args, m, n1, c)
                    w2, _ = fl_train(args, m, n2, c)
                    got[c] = (w2 - w1) / (n2 - n1)
                    walls[key][c] = [min(walls[key][c][0], w1), min(walls[key][c][1], w2)]
            say(f"round {r + 1}/{args.rounds} {key}: " + ", ".join(f"{c} {fmt_time(got[c])}" for c in ("bf16", "fp32", "jax")))

    best = {}
    for m in models:
        key = m[0]
        best[key] = {"jax": jax_best[key]}
        for p in ("bf16", "fp32"):
            n1, n2 = setup[key][1][p]
            best[key][p] = (walls[key][p][1] - walls[key][p][0]) / (n2 - n1)
    rows = [(m, setup[m[0]][0], best[m[0]]) for m in models]
    machine = (
        f"numpy's single-thread sgemm {sgemm / 1e9:.0f} GMAC/s at 512^3; "
        f"load average {load0:.1f} at the start, {loadavg():.1f} at the end"
    )
    text = provenance(args, machine) + "\n\n" + table(rows)
    print(text)
    if args.write:
        write_doc(text)
    say(f"done in {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
