#!/usr/bin/env python3
"""FLA adapter for `kcpbench run --backend exec:...` (docs/external.md): runs
flash-linear-attention's Triton kernels `fla.ops.gated_delta_rule.chunk_gated_delta_rule` (GDN) and
`fla.ops.kda.chunk_kda` (KDA) on the row kcpbench wrote, and the backward by autograd with the
manifest's loss, L = sum(o * dO) + sum(ht * dht), given to autograd as the output gradients.

    kcpbench run --rows int1 --backend "exec:python3 scripts/adapters/fla_adapter.py" --json fla.json
    kcpbench run --rows int1 --backend "exec:python3 scripts/adapters/fla_adapter.py --bypass-hopper-check" ...

Needs torch with CUDA and the `flash-linear-attention` package (fla); one GPU (--device, default
cuda:0). Mapping of the manifest onto FLA's arguments:

* layouts: kcpbench's token-major [T, H, K] etc. are FLA's [B, T, H, K] with B = 1; sequences go
  in `cu_seqlens` (int64, [N + 1]); h0 / ht are [N, HV, K, V] in both (key-major, state_v_first
  False).
* dtypes: q, k, v, beta and dO are cast to the row's dtype (bf16 / fp16; the float32 values hold
  exactly representable 16-bit values, so the cast is lossless); the gate input, A_log, dt_bias,
  h0 and dht stay float32 (FLA's KDA requires a float32 initial state).
* scale, `use_qk_l2norm_in_kernel` = manifest qk_l2norm; GVA (HV > H) is FLA's own (value head j
  uses q/k head j // (HV / H), as in kcpbench).
* gates: direct -> g is the log-decay (use_gate_in_kernel False); softplus -> use_gate_in_kernel
  True with A_log [HV] and dt_bias (GDN [HV], KDA [HV * K]); lower_bound (KDA only) -> also
  lower_bound=value (A_log may be absent); `--safe-gate` passes safe_gate=True (FLA then requires
  -5 <= lower_bound < 0). GDN has no lower_bound form in FLA: such a row exits 2 with a message.
* outputs: o, ht, dq, dk, dv, dg (the gradient w.r.t. the gate input as given), dbeta, dA_log,
  ddt_bias (KDA: reshaped to [HV, K]), dh0: whatever the manifest lists, as float32.

FLA's Hopper refusal (issue #640): `fla.ops.common.chunk_o.chunk_bwd_dqkwg` raises RuntimeError
when `g is not None and IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1`, i.e.
the gated GDN backward on Hopper with Triton >= 3.4.0 and < 3.7.1; FLA then advises Triton >= 3.7.1
or TileLang, whose backend the `dispatch('common')` decorator picks by default on Hopper with
Triton >= 3.4.0 when tilelang is installed (FLA_TILELANG=0 turns it off). `--bypass-hopper-check`
sets FLA_TILELANG=0 (unless set already) so the Triton kernel runs, and sets the module global
`TRITON_ABOVE_3_7_1` of fla.ops.common.chunk_o to True, which makes that condition false (the
function reads the global at call time; no other code of chunk_o reads it). It prints what it
patched to the log; on an FLA version without that check it says so and runs unpatched.
"""
import argparse
import json
import os
import sys

import numpy as np


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bypass-hopper-check", action="store_true",
                    help="run FLA's Triton gated backward where FLA refuses it (Hopper, Triton 3.4.0 to 3.7.0)")
    ap.add_argument("--safe-gate", action="store_true", help="KDA lower_bound rows: pass safe_gate=True")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("folder", help="the folder kcpbench wrote (manifest.json, inputs/)")
    return ap.parse_args(argv)


def bypass_hopper_check():
    """Disables FLA's refusal of the gated chunk_bwd_dqkwg on Hopper (see the module docstring)."""
    os.environ.setdefault("FLA_TILELANG", "0")
    import fla.ops.common.chunk_o as chunk_o
    if hasattr(chunk_o, "TRITON_ABOVE_3_7_1"):
        print(f"fla_adapter: bypass: fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 "
              f"{chunk_o.TRITON_ABOVE_3_7_1} -> True; FLA_TILELANG={os.environ['FLA_TILELANG']}", flush=True)
        chunk_o.TRITON_ABOVE_3_7_1 = True
    else:
        print("fla_adapter: bypass: this FLA has no TRITON_ABOVE_3_7_1 check in fla.ops.common.chunk_o; "
              "nothing patched", flush=True)


def load(folder, man, dev):
    import torch
    return {name: torch.from_numpy(np.load(os.path.join(folder, spec["file"]))).to(dev)
            for name, spec in man["inputs"].items()}


def leaves(man, x, dev):
    """The FLA arguments as autograd leaves (dtype casts as in the module docstring)."""
    import torch
    dt = torch.bfloat16 if man["dtype"] == "bf16" else torch.float16
    kda = man["op"] == "kda"
    t = {}
    for n in ("q", "k", "v", "beta"):
        t[n] = x[n].to(dt)[None].contiguous().detach().requires_grad_(True)
    t["g"] = x["g"].float()[None].contiguous().detach().requires_grad_(True)
    if "A_log" in x:
        t["A_log"] = x["A_log"].float().detach().requires_grad_(True)
    if "dt_bias" in x:
        t["dt_bias"] = (x["dt_bias"].float().reshape(-1) if kda else x["dt_bias"].float()).detach().requires_grad_(True)
    if "h0" in x:
        t["h0"] = x["h0"].float().contiguous().detach().requires_grad_(True)
    return t, dt


def run_fla(man, t, cu, args):
    gate = man["gate"]["form"]
    kw = dict(scale=man["scale"], initial_state=t.get("h0"), output_final_state=True,
              use_qk_l2norm_in_kernel=man["qk_l2norm"], cu_seqlens=cu)
    if gate != "direct":
        kw.update(use_gate_in_kernel=True, A_log=t.get("A_log"), dt_bias=t.get("dt_bias"))
    if man["op"] == "gdn":
        if gate == "lower_bound":
            sys.exit("fla_adapter: FLA's chunk_gated_delta_rule has no lower_bound gate form")
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        return chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)
    from fla.ops.kda import chunk_kda
    if gate == "lower_bound":
        kw.update(lower_bound=man["gate"]["lower_bound"], safe_gate=args.safe_gate)
    return chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)


def main(argv):
    args = parse_args(argv[1:])
    if args.bypass_hopper_check:
        bypass_hopper_check()
    import torch
    import fla
    with open(os.path.join(args.folder, "manifest.json")) as f:
        man = json.load(f)
    if man["protocol"] != "kcpbench.external/1":
        sys.exit(f"fla_adapter: protocol {man['protocol']!r} is not kcpbench.external/1")
    import triton
    print(f"fla_adapter: fla {getattr(fla, '__version__', '?')}, torch {torch.__version__}, "
          f"triton {triton.__version__}, {torch.cuda.get_device_name(args.device)}", flush=True)
    x = load(args.folder, man, args.device)
    t, dt = leaves(man, x, args.device)
    cu = torch.tensor(man["cu_seqlens"], dtype=torch.long, device=args.device)
    o, ht = run_fla(man, t, cu, args)
    outs, grads = [o], [x["dO"].to(o.dtype)[None]]
    if "dht" in x:
        outs.append(ht)
        grads.append(x["dht"].to(ht.dtype))
    names = [n for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "h0") if n in t]
    got = torch.autograd.grad(outs, [t[n] for n in names], grads, allow_unused=True)
    res = {"o": o[0], "ht": ht}
    for n, g in zip(names, got):
        res["dh0" if n == "h0" else "d" + n] = g[0] if n in ("q", "k", "v", "g", "beta") and g is not None else g
    os.makedirs(os.path.join(args.folder, "outputs"), exist_ok=True)
    for name, spec in man["outputs"].items():
        if res.get(name) is None:
            print(f"fla_adapter: FLA gives no {name}", flush=True)
            continue
        arr = res[name].detach().float().reshape(spec["shape"]).cpu().numpy()
        np.save(os.path.join(args.folder, "outputs", name + ".npy"), np.ascontiguousarray(arr))


if __name__ == "__main__":
    main(sys.argv)
