#!/usr/bin/env python3
"""Tests of scripts/fp_ops_diff.py on a one-kernel git repository (needs nvcc).

  fp_ops_diff_test.py --script FP_OPS_DIFF --nvcc NVCC
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = NVCC = None

# MUL decides whether `r = MUL(a, b) + c` contracts into one fma (a * b) or stays a rounded
# product and an add (__fmul_rn): the line itself does not change.
KERNEL = """#define MUL(x, y) %s
__global__ void k(const float* a, const float* b, const float* c, float* out) {
  // %s
  const int i = threadIdx.x;
  out[i] = MUL(a[i], b[i]) + c[i];
}
"""


def git(root, *args):
    subprocess.run(["git", "-C", root, *args], check=True, capture_output=True)


def repo(mul, comment="a kernel"):
    root = tempfile.mkdtemp(prefix="fp_ops_test_")
    with open(os.path.join(root, "k.cu"), "w") as f:
        f.write(KERNEL % (mul, comment))
    git(root, "init", "-q")
    git(root, "add", "k.cu")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return root


def rewrite(root, mul, comment="a kernel"):
    with open(os.path.join(root, "k.cu"), "w") as f:
        f.write(KERNEL % (mul, comment))


def run(root):
    p = subprocess.run([sys.executable, SCRIPT, "--root", root, "--arch", "sm_80", "k.cu"],
                       capture_output=True, text=True, env=dict(os.environ, NVCC=NVCC))
    return p.returncode, p.stdout + p.stderr


class FpOpsDiff(unittest.TestCase):
    def test_a_contraction_change_on_an_unchanged_line_is_reported(self):
        root = repo("((x) * (y))")
        rewrite(root, "__fmul_rn(x, y)")
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("OPERATIONS MOVED", out)
        self.assertIn("k.cu:5", out)  # the line of `out[i] = ...`, its text unchanged

    def test_a_change_that_keeps_the_operations_passes(self):
        root = repo("((x) * (y))")
        rewrite(root, "((x) * (y))", "the same kernel, another comment")
        rc, out = run(root)
        self.assertEqual(rc, 0, out)
        self.assertIn("unchanged lines keep their operations", out)

    def test_a_compile_error_exits_2(self):
        root = repo("((x) * (y))")
        rewrite(root, "((x) * (y)")  # unbalanced
        rc, out = run(root)
        self.assertEqual(rc, 2, out)
        self.assertIn("nvcc failed", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--nvcc", required=True)
    args, rest = ap.parse_known_args()
    SCRIPT, NVCC = args.script, args.nvcc
    unittest.main(argv=[sys.argv[0]] + rest)
