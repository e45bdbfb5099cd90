#!/usr/bin/env python3
"""Times FLA's Triton GDN and KDA kernels on the issue 16 / 17 timing shapes and writes JSON, so a
kcpbench number (`kcp_gpu_bench`, `kcpbench run --bench`) is always quoted beside FLA's from the same
device session (docs/perf-notes.md).

    python3 scripts/fla_bench.py --out OUT.json [--T 8192 32768] [--ops gdn kda]

Shapes (B = 1, bf16, in-kernel L2 norm of q and k, direct log-decay gates, beta in (0, 1), no
initial state, one sequence):
  gdn: H = 16, HV = 32, K = V = 128 (`chunk_gated_delta_rule`, g [1, T, HV])
  kda: H = HV = 32, K = V = 128 (`chunk_kda`, g [1, T, HV, K])
Gates are log-sigmoid-like values in (-0.7, -0.05), as in kcp_gpu_bench. Timing: CUDA events around
the forward alone, and around forward + backward (autograd with a random dO), median of --repeats
after --warmup runs; backward = (fwd+bwd) - fwd. FLA's Hopper refusal of the gated GDN backward
(Triton 3.4.0 to 3.7.0, FLA issue #640) is bypassed as in scripts/adapters/fla_adapter.py (the
timing is what FLA's Triton kernel costs; its correctness is judged by kcpbench's external backend).
Needs torch with CUDA and flash-linear-attention (carried as a wheel: scripts/fla_h200.sh).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "adapters"))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--T", type=int, nargs="+", default=[8192, 32768], help="sequence lengths")
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cuda:0")
    return ap.parse_args(argv)


SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}


def make_inputs(op, T, dev, torch):
    s = SHAPES[op]
    gen = torch.Generator(device=dev).manual_seed(1)

    def uni(shape, lo, hi, dtype):
        return (lo + (hi - lo) * torch.rand(shape, generator=gen, device=dev)).to(dtype)

    bf = torch.bfloat16
    x = dict(q=uni((1, T, s["H"], s["K"]), -1, 1, bf), k=uni((1, T, s["H"], s["K"]), -1, 1, bf),
             v=uni((1, T, s["HV"], s["V"]), -1, 1, bf), beta=uni((1, T, s["HV"]), 0.05, 0.95, bf))
    gshape = (1, T, s["HV"]) if op == "gdn" else (1, T, s["HV"], s["K"])
    x["g"] = uni(gshape, -0.7, -0.05, torch.float32)
    for t in x.values():
        t.requires_grad_(True)
    dO = uni((1, T, s["HV"], s["V"]), -1, 1, bf)
    return x, dO


def forward(op, x):
    kw = dict(scale=SHAPES[op]["K"] ** -0.5, use_qk_l2norm_in_kernel=True)
    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        return chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)[0]
    from fla.ops.kda import chunk_kda
    return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)[0]


def time_ms(fn, warmup, repeats, torch):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), times


def bench(op, T, args, torch):
    x, dO = make_inputs(op, T, args.device, torch)

    def fwd():
        with torch.no_grad():
            forward(op, x)

    def fwd_bwd():
        for t in x.values():
            t.grad = None
        forward(op, x).backward(dO)

    f, f_all = time_ms(fwd, args.warmup, args.repeats, torch)
    fb, fb_all = time_ms(fwd_bwd, args.warmup, args.repeats, torch)
    e = dict(op=op, T=T, B=1, dtype="bf16", qk_l2norm=True, gate="direct", **SHAPES[op], fwd_ms=round(f, 4),
             fwd_bwd_ms=round(fb, 4), bwd_ms=round(fb - f, 4), warmup=args.warmup, repeats=args.repeats,
             fwd_ms_all=[round(v, 4) for v in f_all], fwd_bwd_ms_all=[round(v, 4) for v in fb_all])
    print(f"fla {op} T={T}: fwd {f:.3f} ms  bwd {fb - f:.3f} ms  fwd+bwd {fb:.3f} ms (median of {args.repeats})",
          flush=True)
    return e


def main(argv):
    args = parse_args(argv[1:])
    from fla_adapter import bypass_hopper_check
    bypass_hopper_check()
    import torch
    import triton
    import fla
    ctx = dict(fla=getattr(fla, "__version__", "?"), torch=torch.__version__, triton=triton.__version__,
               device=torch.cuda.get_device_name(args.device), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               command_line=argv, hopper_check_bypassed=True)
    entries = []
    for op in args.ops:
        for T in args.T:
            entries.append(bench(op, T, args, torch))
            with open(args.out, "w") as f:  # after every entry: a cut-off run keeps what it measured
                json.dump(dict(schema="kcpbench.fla_bench/1", context=ctx, entries=entries), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
