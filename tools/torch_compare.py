#!/usr/bin/env python3
"""Side-by-side timing of PyTorch SDPA (flash and cuDNN backends) on exactly the shapes fused-attn timed.

Reads the runner's JSON rows (`fused-attn report --backend gpu --json`), times
torch.nn.functional.scaled_dot_product_attention on the same shape/dtype/causality with the same CUDA-event
method (warm-up, median of repeats, inputs rotated past L2), and prints our ratio to each backend. Decode rows
are compared against SDPA over a *gathered dense* cache (SDPA has no paged cache) and labelled so.
A comparison tool only: the crate never needs Python.

usage: torch_compare.py REPORT.jsonl [--out compare.jsonl] [--repeats N]
"""
import argparse
import json
import math
import statistics
import sys


def load_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def time_ms(torch, fn, inputs, repeats):
    """Median milliseconds of fn(*inputs[i % len]) with CUDA events, after warm-up."""
    for i in range(3):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copies_for(torch, nbytes):
    """How many input sets to rotate through so repeated launches do not run out of L2."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20) or (64 << 20)
    return max(1, min(16, math.ceil(2 * l2 / max(nbytes, 1))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--out")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # noqa: BLE001
        print(f"torch_compare: PyTorch unavailable ({e}); skipping", file=sys.stderr)
        return 0
    if not torch.cuda.is_available():
        print("torch_compare: no CUDA device visible to PyTorch; skipping", file=sys.stderr)
        return 0

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    out_rows = []
    rows = [r for r in load_rows(args.report) if r.get("backend") == "gpu" and r.get("ms")]
    print(f"{'op':8}{'dtype':6}{'D':>5}{'B':>5}{'Hq':>5}{'Hkv':>5}{'Tq':>7}{'Tk':>7} {'causal':7}"
          f"{'ours ms':>10}{'flash ms':>10}{'cudnn ms':>10}{'vs flash':>10}{'vs cudnn':>10}  note")
    for r in rows:
        dtype = torch.bfloat16 if r["dtype"] == "bf16" else torch.float16
        b, hq, hkv, d = r["batch"], r["heads_q"], r["heads_kv"], r["head_dim"]
        tq, tk, causal = r["seqlen_q"], r["seqlen_k"], bool(r["causal"])
        note = ""
        if r["op"] == "decode":
            tq, causal, note = 1, False, "dense-gathered cache"
        if causal and tq != tk:
            # SDPA's is_causal is top-left aligned; ours is bottom-right. Not the same problem.
            note = "skipped: causal with Tq != Tk (SDPA aligns top-left)"
            print(f"{r['op']:8}{r['dtype']:6}{d:>5}{b:>5}{hq:>5}{hkv:>5}{tq:>7}{tk:>7} {str(causal):7}  {note}")
            continue
        nbytes = 2 * (b * hq * tq * d + 2 * b * hkv * tk * d)
        sets = []
        for _ in range(copies_for(torch, nbytes)):
            q = torch.randn(b, hq, tq, d, device="cuda", dtype=dtype)
            k = torch.randn(b, hkv, tk, d, device="cuda", dtype=dtype)
            v = torch.randn(b, hkv, tk, d, device="cuda", dtype=dtype)
            sets.append((q, k, v))
        gqa = hq != hkv
        res = {"ours_ms": r["ms"]}
        for name, be in backends.items():
            try:
                with sdpa_kernel(be):
                    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                    res[name + "_ms"] = time_ms(torch, fn, sets, args.repeats)
            except Exception as e:  # noqa: BLE001  (backend unsupported for this shape)
                res[name + "_ms"] = None
                res[name + "_error"] = str(e).splitlines()[0][:120]
        def ratio(x):
            return None if not x else x / r["ms"]
        res.update({k: r[k] for k in ("op", "dtype", "head_dim", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "causal")})
        res["speedup_vs_flash"] = ratio(res.get("flash_ms"))
        res["speedup_vs_cudnn"] = ratio(res.get("cudnn_ms"))
        res["note"] = note
        out_rows.append(res)
        fmt = lambda x: f"{x:10.4f}" if x else f"{'-':>10}"
        fmtr = lambda x: f"{x:9.2f}x" if x else f"{'-':>10}"
        print(f"{r['op']:8}{r['dtype']:6}{d:>5}{b:>5}{hq:>5}{hkv:>5}{tq:>7}{tk:>7} {str(causal):7}"
              f"{fmt(r['ms'])}{fmt(res.get('flash_ms'))}{fmt(res.get('cudnn_ms'))}"
              f"{fmtr(res['speedup_vs_flash'])}{fmtr(res['speedup_vs_cudnn'])}  {note}")
    if args.out:
        with open(args.out, "w") as f:
            for row in out_rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
