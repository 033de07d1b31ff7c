#!/usr/bin/env python3
"""Side-by-side timing of PyTorch SDPA (flash and cuDNN backends) on exactly the shapes fused-attn timed,
plus the bf16 matmul ceiling measured in the same run.

Reads the runner's JSON rows (`fused-attn report --backend gpu --json`, one object per line; rows without a
time are ignored) and, for every timed row, times torch.nn.functional.scaled_dot_product_attention on the
same shape, dtype, causality and memory layout (q/k/v allocated [B, T, H, D] like ours and viewed as SDPA's
[B, H, T, D]) with CUDA events: warm-up, then back-to-back launches between one event pair, median over
repeats, input sets rotated so a launch never finds its inputs in L2. It prints our time, theirs and
"their ms / our ms" (> 1: ours is faster).

- GQA: torch >= 2.5 runs it natively (enable_gqa=True); older torch gets K/V expanded to Hq heads with
  repeat_interleave (head h reads KV head h // G, as ours), labelled "gqa-expanded" (it reads G x the KV
  bytes, so it is not the same memory traffic).
- Causal: ours is bottom-right aligned. With Tq == Tk that is SDPA's is_causal; with Tq != Tk the row uses
  torch.nn.attention.bias.causal_lower_right when this torch has it, else it is skipped and says why.
- Decode rows: SDPA has no paged cache, so they run with Tq = 1 over a *gathered dense* cache
  [B, Tk, Hkv, D], labelled "dense-gathered cache" (contiguous K/V is easier on the memory system than
  pages).
- The matmul ceiling: torch.matmul bf16 8192^3 (cuBLAS), timed the same way. The crate does not link
  cuBLAS, so this is where "fraction of what this GPU's tensor cores really do" comes from; every prefill
  row prints ours and flash's TFLOPS as a fraction of it. --ceiling-out writes it as JSON so the bundle can
  hand it to the criterion benches (FA_MATMUL_TFLOPS).

A comparison tool only: the crate never needs Python.

usage: torch_compare.py REPORT.jsonl [--out compare.jsonl] [--ceiling-out ceilings.json] [--repeats N]
       torch_compare.py --self-test      # no torch, no GPU: parses and formats a synthetic report
exit status: 0 done, 1 bad input, 3 skipped (PyTorch or its CUDA device unavailable).
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile

EXIT_SKIPPED = 3
MATMUL_N = 8192


# ----------------------------------------------------------------------------------- pure helpers (no torch)

def load_rows(path):
    """JSON objects, one per line; other lines (log text) are ignored."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise SystemExit(f"torch_compare: {path}:{n}: not JSON: {e}")
    return rows


def number(x):
    """A finite float from a JSON value (the runner writes NaN/inf as strings, unmeasured as null)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def timed_rows(rows):
    """Rows worth comparing: GPU rows with a positive time. Paged-prefill rows are left out: the report times
    each against a dense prefill row of the same (query, key) pairs, which is compared instead (SDPA has no
    paged cache). FP8-cache decode rows stay; SDPA's time for their shape is the bf16 decode row's (measured once)."""
    return [r for r in rows if r.get("backend") == "gpu" and r.get("op") != "paged-prefill"
            and (number(r.get("ms")) or 0) > 0]


def visible_keys(causal, tq, tk, i):
    """Keys query row i sees (bottom-right causal alignment, docs/semantics.md)."""
    if not causal:
        return tk
    return max(0, min(tk, i + 1 + tk - tq))


def prefill_flops(b, hq, tq, tk, d, causal):
    """4·B·Hq·(visible pairs)·D; causal with Tq == Tk counts exactly half (src/timing.rs::prefill_flops)."""
    if not causal:
        pairs = tq * tk
    elif tq == tk:
        pairs = tq * tk / 2
    else:
        pairs = sum(visible_keys(True, tq, tk, i) for i in range(tq))
    return 4.0 * b * hq * pairs * d


def problem(r):
    """The SDPA problem of one of our rows: (b, hq, hkv, d, tq, tk, causal, note)."""
    b, hq, hkv, d = int(r["batch"]), int(r["heads_q"]), int(r["heads_kv"]), int(r["head_dim"])
    tq, tk, causal = int(r["seqlen_q"]), int(r["seqlen_k"]), bool(r["causal"])
    note = []
    if r["op"] == "decode":
        tq, causal = 1, False
        note.append("dense-gathered cache")
    return b, hq, hkv, d, tq, tk, causal, note


def ratio(theirs, ours):
    """their ms / our ms (> 1: ours is faster), or None."""
    return theirs / ours if theirs and ours else None


HEADER = (f"{'op':8}{'dtype':6}{'D':>5}{'B':>5}{'Hq':>5}{'Hkv':>5}{'Tq':>7}{'Tk':>7} {'causal':7}"
          f"{'ours ms':>10}{'flash ms':>10}{'cudnn ms':>10}{'flash/ours':>11}{'cudnn/ours':>11}"
          f"{'ours TF':>9}{'%matmul':>8}  note")


def format_row(r, res, matmul_tflops):
    """One table line from our row and the result dict (flash_ms, cudnn_ms, ours_tflops, note)."""
    b, hq, hkv, d, tq, tk, causal, _ = problem(r)
    f = lambda x: f"{x:10.4f}" if x else f"{'-':>10}"
    g = lambda x: f"{x:10.2f}x" if x else f"{'-':>11}"
    tf = res.get("ours_tflops")
    pct = f"{100 * tf / matmul_tflops:7.0f}%" if tf and matmul_tflops else f"{'-':>8}"
    return (f"{r['op']:8}{r['dtype']:6}{d:>5}{b:>5}{hq:>5}{hkv:>5}{tq:>7}{tk:>7} {str(causal):7}"
            f"{f(number(r['ms']))}{f(res.get('flash_ms'))}{f(res.get('cudnn_ms'))}"
            f"{g(res.get('vs_flash'))}{g(res.get('vs_cudnn'))}"
            f"{(f'{tf:9.1f}' if tf else f'{chr(45):>9}')}{pct}  {res.get('note', '')}")


def our_kernel(r):
    """Which of our prefill kernels a row ran ("sm80"/"sm90", from its label), or "" when not forced."""
    first = str(r.get("label", "")).split(" ", 1)[0]
    return first if first in ("sm80", "sm90") else ""


def result_for(r, flash_ms, cudnn_ms, notes):
    """The comparison record of one row (what --out writes)."""
    b, hq, hkv, d, tq, tk, causal, base_notes = problem(r)
    ours = number(r["ms"])
    res = {k: r.get(k) for k in ("op", "dtype", "head_dim", "batch", "heads_q", "heads_kv", "seqlen_q",
                                  "seqlen_k", "causal", "page_size")}
    res.update({"ours_ms": ours, "flash_ms": flash_ms, "cudnn_ms": cudnn_ms,
                "vs_flash": ratio(flash_ms, ours), "vs_cudnn": ratio(cudnn_ms, ours)})
    if r["op"] == "prefill":
        flops = prefill_flops(b, hq, tq, tk, d, causal)
        res["ours_tflops"] = flops / (ours * 1e-3) / 1e12
        res["flash_tflops"] = flops / (flash_ms * 1e-3) / 1e12 if flash_ms else None
    res["note"] = "; ".join(base_notes + notes)
    return res


def self_test():
    """Runs without torch or a GPU: a synthetic report through parsing, filtering, FLOP counting, the
    result records and the table (what CI can check)."""
    rows = [
        {"op": "prefill", "backend": "gpu", "dtype": "bf16", "head_dim": 128, "batch": 4, "heads_q": 16,
         "heads_kv": 16, "seqlen_q": 4096, "seqlen_k": 4096, "causal": True, "page_size": None,
         "passed": True, "ms": 2.5, "tflops": 220.0, "gbps": None},
        {"op": "prefill", "backend": "gpu", "dtype": "fp16", "head_dim": 64, "batch": 1, "heads_q": 8,
         "heads_kv": 2, "seqlen_q": 3, "seqlen_k": 5, "causal": True, "page_size": None,
         "passed": True, "ms": "NaN", "tflops": None, "gbps": None},
        {"op": "decode", "backend": "gpu", "dtype": "bf16", "head_dim": 128, "batch": 64, "heads_q": 32,
         "heads_kv": 8, "seqlen_q": 1, "seqlen_k": 4096, "causal": False, "page_size": 16,
         "passed": True, "ms": 0.09, "tflops": None, "gbps": 3000.0, "pct_of_copy_bw": 0.8},
        {"op": "prefill", "backend": "gpu", "dtype": "bf16", "head_dim": 128, "batch": 1, "heads_q": 2,
         "heads_kv": 1, "seqlen_q": 17, "seqlen_k": 17, "causal": False, "passed": True, "ms": None},
        {"op": "prefill", "backend": "emu", "dtype": "bf16", "head_dim": 128, "batch": 1, "heads_q": 2,
         "heads_kv": 1, "seqlen_q": 17, "seqlen_k": 17, "causal": False, "passed": True, "ms": 5.0},
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.jsonl")
        with open(path, "w") as f:
            f.write("fused-attn report (log line, not JSON)\n")
            for r in rows:
                f.write(json.dumps(r) + "\n")
        loaded = load_rows(path)
    assert len(loaded) == len(rows), loaded
    timed = timed_rows(loaded)
    # NaN, null and emulator rows are not compared.
    assert [r["op"] for r in timed] == ["prefill", "decode"], timed
    assert prefill_flops(2, 16, 1024, 1024, 128, False) == 4.0 * 2 * 16 * 1024 * 1024 * 128
    assert prefill_flops(2, 16, 1024, 1024, 128, True) == 2.0 * 2 * 16 * 1024 * 1024 * 128
    assert prefill_flops(1, 1, 2, 4, 1, True) == 4.0 * 7  # rows see 3 and 4 keys (bottom-right)
    assert prefill_flops(1, 1, 4, 2, 1, True) == 4.0 * 3  # rows see 0, 0, 1, 2 keys
    assert problem(timed[1])[4] == 1 and "dense-gathered cache" in problem(timed[1])[7]
    res = result_for(timed[0], 3.0, None, [])
    assert abs(res["vs_flash"] - 1.2) < 1e-12 and res["vs_cudnn"] is None
    assert abs(res["ours_tflops"] - prefill_flops(4, 16, 4096, 4096, 128, True) / 2.5e-3 / 1e12) < 1e-9
    line = format_row(timed[0], res, 800.0)
    assert "1.20x" in line and "2.5000" in line and "%" in line, line
    dec = result_for(timed[1], 0.1, 0.12, ["gqa-expanded"])
    line = format_row(timed[1], dec, None)
    assert "dense-gathered cache; gqa-expanded" in line and "1.11x" in line, line
    # SDPA call construction with a stand-in for torch.nn.functional: GQA natively or expanded, causal.
    class Tensor:
        def __init__(self, heads):
            self.heads = heads

        def repeat_interleave(self, g, dim):
            assert dim == 1
            return Tensor(self.heads * g)

    class OldF:  # torch < 2.5: no enable_gqa
        @staticmethod
        def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False):
            return (q.heads, k.heads, v.heads, is_causal)

    class NewF:
        @staticmethod
        def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
            return (q.heads, k.heads, v.heads, is_causal, enable_gqa)

    fn, notes = sdpa_callable(None, OldF, 8, 2, 16, 16, True)
    assert notes == ["gqa-expanded"] and fn(Tensor(8), Tensor(2), Tensor(2)) == (8, 8, 8, True), notes
    fn, notes = sdpa_callable(None, NewF, 8, 2, 16, 16, False)
    assert notes == [] and fn(Tensor(8), Tensor(2), Tensor(2)) == (8, 2, 2, False, True), notes
    fn, notes = sdpa_callable(None, NewF, 4, 4, 1, 300, False)  # decode: plain, no GQA flag
    assert notes == [] and fn(Tensor(4), Tensor(4), Tensor(4)) == (4, 4, 4, False, False)
    try:
        import torch.nn.attention.bias  # noqa: F401
        have_bias = True
    except ImportError:
        have_bias = False
    fn, notes = sdpa_callable(None, NewF, 2, 1, 3, 5, True)  # bottom-right causal, Tq != Tk
    assert (fn is not None) == have_bias and notes and ("causal_lower_right" in notes[0]), notes
    print(HEADER)
    print(format_row(timed[0], res, 800.0))
    print(line)
    self_test_main(rows)
    print("torch_compare self-test: ok")
    return 0


def fake_torch_modules():
    """A pure-Python stand-in for the slice of torch this script uses, with a simulated clock: each call
    advances it by a fixed time (matmul 1 ms; SDPA 0.5 ms under flash, 0.25 ms under cuDNN), so the whole
    comparison path runs, and its arithmetic can be checked, without torch or a GPU."""
    import contextlib
    import types
    clock = [0.0]
    backend = ["math"]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.t - self.t

    class Tensor:
        def __init__(self, shape):
            self.shape = list(shape)

        def transpose(self, a, b):
            s = list(self.shape)
            s[a], s[b] = s[b], s[a]
            return Tensor(s)

        def __mul__(self, x):
            return self

        def __sub__(self, x):
            return self

        def repeat_interleave(self, g, dim):
            s = list(self.shape)
            s[dim] *= g
            return Tensor(s)

    def matmul(a, b):
        clock[0] += 1.0

    def sdpa(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
        assert k.shape[1] == q.shape[1] or enable_gqa, "GQA heads without enable_gqa"
        assert not (is_causal and attn_mask is not None)
        clock[0] += {"flash": 0.5, "cudnn": 0.25}[backend[0]]

    @contextlib.contextmanager
    def sdpa_kernel(b):
        backend[0] = b
        yield
        backend[0] = "math"

    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-fake"
    torch.bfloat16, torch.float16 = "bf16", "fp16"
    torch.randn = torch.rand = lambda *shape, device=None, dtype=None: Tensor(shape)
    torch.matmul = matmul
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.get_device_name = lambda i: "Fake GPU"
    cuda.get_device_properties = lambda i: types.SimpleNamespace(L2_cache_size=50 << 20)
    cuda.synchronize = lambda: None
    cuda.Event = Event
    torch.cuda = cuda
    torch.backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 91000))
    nn = types.ModuleType("torch.nn")
    functional = types.ModuleType("torch.nn.functional")
    functional.scaled_dot_product_attention = sdpa
    attention = types.ModuleType("torch.nn.attention")
    attention.SDPBackend = types.SimpleNamespace(FLASH_ATTENTION="flash", CUDNN_ATTENTION="cudnn")
    attention.sdpa_kernel = sdpa_kernel
    bias = types.ModuleType("torch.nn.attention.bias")
    bias.causal_lower_right = lambda tq, tk: ("lower_right", tq, tk)
    torch.nn, nn.functional, nn.attention, attention.bias = nn, functional, attention, bias
    return {"torch": torch, "torch.cuda": cuda, "torch.nn": nn, "torch.nn.functional": functional,
            "torch.nn.attention": attention, "torch.nn.attention.bias": bias}


def self_test_main(rows):
    """main() end to end on the fake torch: the records, the ceiling file and their arithmetic."""
    rows = rows + [
        {"op": "prefill", "backend": "gpu", "dtype": "fp16", "head_dim": 64, "batch": 1, "heads_q": 8,
         "heads_kv": 2, "seqlen_q": 64, "seqlen_k": 128, "causal": True, "passed": True, "ms": 0.01},
    ]
    fake = fake_torch_modules()
    saved = {name: sys.modules.get(name) for name in fake}
    sys.modules.update(fake)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            report, out, ceil = (os.path.join(tmp, n) for n in ("r.jsonl", "c.jsonl", "ceil.json"))
            with open(report, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            assert main([report, "--out", out, "--ceiling-out", ceil, "--repeats", "3"]) == 0
            recs = load_rows(out)
            ceiling = json.load(open(ceil))
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    assert abs(ceiling["matmul_bf16_tflops"] - 2 * MATMUL_N ** 3 / 1e-3 / 1e12) < 1e-6, ceiling
    assert [r["op"] for r in recs] == ["prefill", "decode", "prefill"], recs
    pre, dec, chunk = recs
    assert (pre["flash_ms"], pre["cudnn_ms"]) == (0.5, 0.25) and abs(pre["vs_flash"] - 0.2) < 1e-12, pre
    assert dec["note"] == "dense-gathered cache" and abs(dec["vs_cudnn"] - 0.25 / 0.09) < 1e-9, dec
    assert chunk["note"] == "causal_lower_right", chunk


# ---------------------------------------------------------------------------------------------- timing

def copies_for(torch, nbytes):
    """Input sets to rotate through so ~3x L2 lies between two uses of the same set (at most 16)."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (64 << 20)
    return max(1, min(16, math.ceil(3 * l2 / max(nbytes, 1))))


def time_ms(torch, fn, inputs, repeats, target_ms=2.0):
    """Median ms per call of fn(*inputs[i % len]): warm-up, then `repeats` samples, each one CUDA-event pair
    around enough back-to-back calls to last ~target_ms (so Python's dispatch overlaps the GPU's work
    instead of being timed as idle gaps, as far as the kernel is longer than the dispatch)."""
    i = 0

    def run(n):
        nonlocal i
        for _ in range(n):
            fn(*inputs[i % len(inputs)])
            i += 1

    run(3)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run(3)
    end.record()
    end.synchronize()
    per_call = max(start.elapsed_time(end) / 3, 1e-3)
    inner = max(1, min(200, int(target_ms / per_call)))
    times = []
    for _ in range(repeats):
        start.record()
        run(inner)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def matmul_tflops(torch, repeats):
    """bf16 8192^3 torch.matmul (cuBLAS), TFLOPS = 2·n^3 / time; operands (128 MiB each) rotate in 2 sets."""
    n = MATMUL_N
    sets = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, n, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    ms = time_ms(torch, torch.matmul, sets, repeats)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def backend_contexts(torch):
    """name -> context manager factory restricting SDPA to that backend (cuDNN needs torch >= 2.4; before
    torch.nn.attention (2.3) only the older torch.backends.cuda.sdp_kernel switch exists)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        k = torch.backends.cuda.sdp_kernel
        return {"flash": lambda: k(enable_flash=True, enable_math=False, enable_mem_efficient=False)}
    ctx = {"flash": lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)}
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        ctx["cudnn"] = lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
    return ctx


def has_native_gqa(F):
    """Whether this SDPA takes enable_gqa (torch >= 2.5)."""
    import inspect
    fn = F.scaled_dot_product_attention
    try:
        return "enable_gqa" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a C builtin without a signature: its docstring lists the arguments
        return "enable_gqa" in (getattr(fn, "__doc__", None) or "")


def sdpa_callable(torch, F, hq, hkv, tq, tk, causal):
    """(fn(q, k, v), notes) computing our attention with SDPA, or (None, notes) if this torch cannot."""
    notes = []
    kwargs = {}
    if causal and tq == tk:
        kwargs["is_causal"] = True
    elif causal:
        try:
            from torch.nn.attention.bias import causal_lower_right
        except ImportError:
            return None, ["skipped: causal with Tq != Tk needs causal_lower_right (SDPA's is_causal is top-left)"]
        kwargs["attn_mask"] = causal_lower_right(tq, tk)
        notes.append("causal_lower_right")
    g = hq // hkv
    native_gqa = has_native_gqa(F)
    if g > 1 and native_gqa:
        kwargs["enable_gqa"] = True
    if g > 1 and not native_gqa:
        notes.append("gqa-expanded")
        return (lambda q, k, v: F.scaled_dot_product_attention(
            q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), **kwargs)), notes
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs)), notes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", nargs="?")
    ap.add_argument("--out", help="write one JSON comparison record per row here")
    ap.add_argument("--ceiling-out", help="write the matmul ceiling as JSON here")
    ap.add_argument("--repeats", type=int, default=10, help="timed samples per shape and backend (median)")
    ap.add_argument("--self-test", action="store_true", help="check parsing/formatting without torch")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.report:
        ap.error("REPORT.jsonl is required (or --self-test)")
    rows = timed_rows(load_rows(args.report))
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001  (any import failure means: no usable torch here)
        print(f"torch_compare: SKIPPED: PyTorch unavailable ({e})")
        return EXIT_SKIPPED
    if not torch.cuda.is_available():
        print("torch_compare: SKIPPED: no CUDA device visible to PyTorch")
        return EXIT_SKIPPED

    dev = torch.cuda.get_device_name(0)
    mm = matmul_tflops(torch, args.repeats)
    print(f"torch {torch.__version__} on {dev}; cuDNN {torch.backends.cudnn.version()}")
    print(f"ceiling: bf16 matmul {MATMUL_N}^3 (torch.matmul, same run): {mm:.1f} TFLOPS")
    print("timing: torch = median over repeats of back-to-back calls between one CUDA event pair; ours = the "
          "runner's JSON ms (fused_attn::timing)")
    if args.ceiling_out:
        with open(args.ceiling_out, "w") as f:
            json.dump({"matmul_bf16_tflops": mm, "matmul_n": MATMUL_N, "device": dev,
                       "torch": torch.__version__}, f)
            f.write("\n")
    if not rows:
        print("torch_compare: the report has no timed GPU rows; nothing to compare")
        return 0

    backends = backend_contexts(torch)
    # Records are written as they are made, so a run cut short by a timeout keeps what it measured.
    out_file = open(args.out, "w") if args.out else None
    print(HEADER)
    # On a Hopper GPU the report times each prefill shape on both of our kernels (rows labelled sm80 and
    # sm90): SDPA is timed once per shape and compared with both.
    measured = {}
    for r in rows:
        b, hq, hkv, d, tq, tk, causal, _ = problem(r)
        dtype = torch.bfloat16 if r["dtype"] == "bf16" else torch.float16
        fn, notes = sdpa_callable(torch, F, hq, hkv, tq, tk, causal)
        shape = (r["op"], r["dtype"], b, hq, hkv, d, tq, tk, causal, r.get("page_size"))
        times = {"flash": None, "cudnn": None}
        if shape in measured:
            times, notes = dict(measured[shape][0]), list(measured[shape][1])
        elif fn is not None:
            nbytes = 2 * (2 * b * hq * tq * d + 2 * b * hkv * tk * d)
            sets = []
            for _ in range(copies_for(torch, nbytes)):
                # Our layout, [B, T, H, D], seen by SDPA as [B, H, T, D].
                q = torch.randn(b, tq, hq, d, device="cuda", dtype=dtype).transpose(1, 2)
                k = torch.randn(b, tk, hkv, d, device="cuda", dtype=dtype).transpose(1, 2)
                v = (torch.rand(b, tk, hkv, d, device="cuda", dtype=dtype) * 2 - 0.5).transpose(1, 2)
                sets.append((q, k, v))
            for name in times:
                if name not in backends:
                    notes.append(f"{name}: not in torch {torch.__version__}")
                    continue
                try:
                    with backends[name]():
                        times[name] = time_ms(torch, fn, sets, args.repeats)
                except Exception as e:  # noqa: BLE001  (backend unsupported for this shape/dtype/GPU)
                    notes.append(f"{name}: {str(e).splitlines()[0][:80]}")
            del sets
        measured[shape] = (dict(times), list(notes))
        kernel = our_kernel(r)
        if kernel:
            notes = [f"ours: {kernel} kernel"] + notes
        res = result_for(r, times["flash"], times["cudnn"], notes)
        res["kernel"] = kernel
        print(format_row(r, res, mm), flush=True)
        if out_file:
            out_file.write(json.dumps(res) + "\n")
            out_file.flush()
    if out_file:
        out_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
