#!/usr/bin/env python3
"""A deliberately broken external adapter (tests/scripts/external_test.py): the NumPy reference
adapter (scripts/adapters/numpy_ref.py) with one fault, chosen by --break:

  dk-sign      dk negated                      -> the entry fails on dk (exit 1)
  missing-dk   outputs/dk.npy not written       -> fails naming dk as not provided (exit 1)
  wrong-shape  dv written with a head dimension cut -> fails naming expected and got (exit 1)
  float16      o written as float16             -> fails naming the dtype (exit 1)
  crash        exits with status 3 after a message -> fails naming the status and the log tail
  sigkill      kills itself with SIGKILL        -> fails naming signal 9 (a shell may report 137)
  hang         sleeps far past any deadline    -> the row deadline kills it (exit 5)
  nothing      exits 0 without writing anything -> fails: no output file
  nan-dq       one NaN in dq                    -> fails on dq, naming the non-finite value (exit 1)
  zero-dbeta   dbeta written as zeros           -> fails on dbeta (exit 1)
  dir-o        a directory at outputs/o.npy     -> fails naming o, the other rows still run (exit 1)
  fifo-o       a FIFO at outputs/o.npy          -> fails naming o, without blocking on it (exit 1)
  huge-f64     dq in float64 with one 1e40      -> fails on dq: beyond the float32 range (exit 1)
  long-line    a 1 MB progress line (carriage returns, no newline), then exit 1
                                                -> fails with a log tail of a few KB

    broken_adapter.py --break MODE FOLDER
"""
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "adapters"))
import numpy_ref  # noqa: E402


def main(argv):
    mode, folder = argv[argv.index("--break") + 1], argv[-1]
    if mode == "crash":
        print("broken_adapter: simulated failure in the backward", file=sys.stderr)
        sys.exit(3)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        print("broken_adapter: hanging", flush=True)
        time.sleep(3600)
    if mode == "nothing":
        return
    if mode == "long-line":
        sys.stdout.write("".join(f"\r{i}/100000 |{'#' * 8}" for i in range(100000)))
        sys.exit(1)
    out = numpy_ref.compute(folder)
    if mode == "dk-sign":
        out["dk"] = -out["dk"]
    elif mode == "missing-dk":
        del out["dk"]
    elif mode == "wrong-shape":
        out["dv"] = out["dv"][:, :1]
    elif mode == "nan-dq":
        out["dq"] = out["dq"].copy()
        out["dq"].flat[out["dq"].size // 2] = np.nan
    elif mode == "zero-dbeta":
        out["dbeta"] = np.zeros_like(out["dbeta"])
    elif mode == "huge-f64":
        out["dq"] = out["dq"].astype(np.float64)
        out["dq"].flat[0] = 1e40
    elif mode in ("dir-o", "fifo-o"):
        del out["o"]
    elif mode == "float16":
        out["o"] = out["o"].astype(np.float16)
    else:
        sys.exit(f"broken_adapter: unknown --break {mode}")
    os.makedirs(os.path.join(folder, "outputs"), exist_ok=True)
    for name, arr in out.items():
        np.save(os.path.join(folder, "outputs", name + ".npy"), np.ascontiguousarray(arr))
    if mode == "dir-o":
        os.makedirs(os.path.join(folder, "outputs", "o.npy"))
    if mode == "fifo-o":
        os.mkfifo(os.path.join(folder, "outputs", "o.npy"))


if __name__ == "__main__":
    main(sys.argv)
