#!/usr/bin/env python3
"""NumPy reference adapter for `kcpbench run --backend exec:...` (docs/external.md).

Reads FOLDER/manifest.json and FOLDER/inputs/*.npy, computes GDN or KDA forward (o, ht) and the
exact backward (every gradient the manifest asks for) with a per-token recurrence in float64
(docs/algorithm.md 1.1-1.3), and writes FOLDER/outputs/<name>.npy (float64, C order).

    python3 scripts/adapters/numpy_ref.py FOLDER

Standard library and numpy only. The backward is reverse mode over the tokens, keeping every
state of a sequence (int1 rows are small). It is a second, independent FP64 implementation: run
through the external backend it must pass every int1 row at the row's budgets.
"""
import json
import os
import sys

import numpy as np

L2_EPS = 1e-6  # inside the sqrt (docs/algorithm.md 1.3)


def load_inputs(folder, man):
    return {name: np.load(os.path.join(folder, spec["file"])).astype(np.float64)
            for name, spec in man["inputs"].items()}


def sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def gate(man, x, A_log, kda):
    """(a, da/dx, da/dA_log) of the gate forms (docs/algorithm.md 1.2); x = g + dt_bias."""
    form = man["gate"]["form"]
    if A_log is None:
        eA = 1.0
    else:
        eA = np.exp(A_log)[None, :, None] if kda else np.exp(A_log)[None, :]
    if form == "direct":
        return x, np.ones_like(x), np.zeros_like(x)
    if form == "softplus":
        a = -eA * (np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x))))
        return a, -eA * sigmoid(x), a
    lb = man["gate"]["lower_bound"]
    z = eA * x
    s = sigmoid(z)
    dadz = lb * s * (1.0 - s)
    return lb * s, dadz * eA, (dadz * z if A_log is not None else np.zeros_like(x))


def l2norm(x):
    r = 1.0 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2_EPS)
    return x * r, r


def l2norm_bwd(dy, y, r):
    return r * (dy - np.sum(dy * y, axis=-1, keepdims=True) * y)


def forward_seq(qv, kv, v, beta, dec, rho, S):
    """One sequence, all value heads: returns o, the entry state of every token, e, ht."""
    T = qv.shape[0]
    o = np.zeros(v.shape)
    prev = np.zeros((T,) + S.shape)
    err = np.zeros(v.shape)
    for t in range(T):
        prev[t] = S
        Sd = dec[t][:, :, None] * S
        e = v[t] - np.einsum("hkv,hk->hv", Sd, kv[t])
        S = Sd + beta[t][:, None, None] * kv[t][:, :, None] * e[:, None, :]
        o[t] = rho * np.einsum("hkv,hk->hv", S, qv[t])
        err[t] = e
    return o, prev, err, S


def backward_seq(qv, kv, beta, dec, rho, dO, prev, err, dS):
    """Reverse mode of forward_seq; dS: dL/dht. Returns dq, dk (per value head), dv, dbeta, dlog-decay
    (per channel), dh0."""
    T = qv.shape[0]
    dq, dk = np.zeros(qv.shape), np.zeros(kv.shape)
    dv, dbeta = np.zeros(dO.shape), np.zeros(beta.shape)
    da = np.zeros(dec.shape)
    for t in reversed(range(T)):
        d = dec[t][:, :, None]
        Sd = d * prev[t]
        b = beta[t][:, None, None]
        e = err[t]
        S = Sd + b * kv[t][:, :, None] * e[:, None, :]
        dq[t] = rho * np.einsum("hkv,hv->hk", S, dO[t])
        dS = dS + rho * qv[t][:, :, None] * dO[t][:, None, :]
        dbeta[t] = np.einsum("hkv,hk,hv->h", dS, kv[t], e)
        de = beta[t][:, None] * np.einsum("hkv,hk->hv", dS, kv[t])
        dk[t] = beta[t][:, None] * np.einsum("hkv,hv->hk", dS, e) - np.einsum("hkv,hv->hk", Sd, de)
        dv[t] = de
        dSd = dS - kv[t][:, :, None] * de[:, None, :]
        dd = np.einsum("hkv,hkv->hk", dSd, prev[t])  # dL/d(decay factor), per key channel
        da[t] = np.sum(dd * dec[t], axis=1, keepdims=True) if dec.shape[2] == 1 else dd * dec[t]
        dS = d * dSd
    return dq, dk, dv, dbeta, da, dS


def compute(folder):
    """Every output the manifest asks for, as a dict name -> float64 array."""
    with open(os.path.join(folder, "manifest.json")) as f:
        man = json.load(f)
    x = load_inputs(folder, man)
    sh = man["shape"]
    T, H, HV, K, V = sh["T"], sh["H"], sh["HV"], sh["K"], sh["V"]
    G, kda, rho = HV // H, man["op"] == "kda", man["scale"]
    cu = man["cu_seqlens"]
    q, k = x["q"], x["k"]
    if man["qk_l2norm"]:
        q, rq = l2norm(q)
        k, rk = l2norm(k)
    heads = np.arange(HV) // G  # GVA: value head j uses q/k head j // G
    qv, kv = q[:, heads], k[:, heads]
    g = x["g"] if kda else x["g"][:, :, None]  # [T, HV, K or 1]
    dt = x.get("dt_bias")
    xg = g + (0.0 if dt is None else (dt[None] if kda else dt[None, :, None]))
    a, dadx, dadA = gate(man, xg if kda else xg[:, :, 0], x.get("A_log"), kda)
    if not kda:
        a, dadx, dadA = a[:, :, None], dadx[:, :, None], dadA[:, :, None]
    dec = np.exp(a)
    out = {n: np.zeros(spec["shape"]) for n, spec in man["outputs"].items()}
    dqv, dkv, da = np.zeros(qv.shape), np.zeros(kv.shape), np.zeros(dec.shape)
    for n in range(len(cu) - 1):
        s, e = cu[n], cu[n + 1]
        S0 = x["h0"][n] if "h0" in x else np.zeros((HV, K, V))
        o, prev, err, ht = forward_seq(qv[s:e], kv[s:e], x["v"][s:e], x["beta"][s:e], dec[s:e], rho, S0)
        out["o"][s:e] = o
        if "ht" in out:
            out["ht"][n] = ht
        dS = x["dht"][n].copy() if "dht" in x else np.zeros((HV, K, V))
        r = backward_seq(qv[s:e], kv[s:e], x["beta"][s:e], dec[s:e], rho, x["dO"][s:e], prev, err, dS)
        dqv[s:e], dkv[s:e], out["dv"][s:e], out["dbeta"][s:e], da[s:e] = r[:5]
        if "dh0" in out:
            out["dh0"][n] = r[5]
    dq = dqv.reshape(T, H, G, K).sum(axis=2)
    dk = dkv.reshape(T, H, G, K).sum(axis=2)
    if man["qk_l2norm"]:
        dq, dk = l2norm_bwd(dq, q, rq), l2norm_bwd(dk, k, rk)
    out["dq"], out["dk"] = dq, dk
    dg = da * dadx
    out["dg"] = dg if kda else dg[:, :, 0]
    if "dA_log" in out:
        out["dA_log"] = np.sum(da * dadA, axis=(0, 2))
    if "ddt_bias" in out:
        out["ddt_bias"] = np.sum(dg, axis=0) if kda else np.sum(dg, axis=(0, 2))
    return out


def write_outputs(folder, out):
    os.makedirs(os.path.join(folder, "outputs"), exist_ok=True)
    for name, arr in out.items():
        np.save(os.path.join(folder, "outputs", name + ".npy"), np.ascontiguousarray(arr, dtype=np.float64))


def main(argv):
    if len(argv) >= 2 and argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if len(argv) < 2:
        sys.exit("usage: numpy_ref.py FOLDER  (FOLDER holds manifest.json and inputs/, docs/external.md)")
    folder = argv[-1]
    with open(os.path.join(folder, "manifest.json")) as f:
        proto = json.load(f)["protocol"]
    if proto != "kcpbench.external/1":
        sys.exit(f"numpy_ref.py: protocol {proto!r} is not kcpbench.external/1")
    write_outputs(folder, compute(folder))


if __name__ == "__main__":
    main(sys.argv)
