#!/usr/bin/env python3
"""Tests of scripts/check_comment_paths.py on small temporary trees.

  check_comment_paths_test.py --script CHECKER
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = None


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def run_checker(root):
    p = subprocess.run([sys.executable, SCRIPT, "--root", root], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stdout.splitlines()


class CheckCommentPaths(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = self._tmp.name
        write(self.root, "core/b.h", "// b\n")
        write(self.root, "docs/design.md", "# design\n")

    def tearDown(self):
        self._tmp.cleanup()

    def test_catches_exactly_the_missing_path(self):
        write(self.root, "core/a.h",
              '// Uses core/b.h (see docs/design.md 5) and core/missing.h.\n'
              '/* results/<device>/x.json and kernels/cuda/*_kernel.cuh are placeholders */\n'
              'const char* s = "core/not_a_comment.h";  // b.h sits beside this file\n')
        code, lines = run_checker(self.root)
        self.assertEqual(code, 1)
        self.assertEqual(lines, ["core/a.h:1: core/missing.h (no such file or folder)"])

    def test_clean_tree_passes(self):
        write(self.root, "scripts/x.py", '"""Reads core/b.h."""\nprint("core/gone.h")  # core/b.h\n')
        code, lines = run_checker(self.root)
        self.assertEqual((code, lines), (0, []))

    def test_design_files_outside_the_repository_are_errors(self):
        write(self.root, "tests/CMakeLists.txt", "# Tiers (DESIGN.md 3)\nset(x \"# ALGORITHM.md\")\n")
        code, lines = run_checker(self.root)
        self.assertEqual(code, 1)
        self.assertEqual(lines, ["tests/CMakeLists.txt:1: DESIGN.md (not in the repository, cite docs/design.md)"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    args, rest = ap.parse_known_args()
    SCRIPT = os.path.abspath(args.script)
    unittest.main(argv=[sys.argv[0]] + rest)
