#!/usr/bin/env python3
"""Checks that every repository path named in a code comment exists.

  check_comment_paths.py [--root DIR]

Scans the comments (not the code or its string literals) of *.h *.cpp *.cu *.cuh CMakeLists.txt
*.cmake *.sh *.py and of extension-less shell scripts under app core kernels reference tests
scripts cmake .ci (plus the top-level CMakeLists.txt) for tokens that look like repository paths:
  * a path that starts with a top-level folder (app/ core/ kernels/ reference/ tests/ scripts/
    configs/ docs/ results/ cmake/ .ci/) must exist below the root, as a file or a folder;
  * a bare file name ending in .md must exist at the root (README.md); the design files kept
    outside the repository (ALGORITHM, DESIGN and STYLE, each .md) are errors: cite docs/ instead;
  * a bare source file name (*.h *.cpp *.cu *.cuh *.py *.sh *.cmake) must exist beside the
    commenting file or anywhere in the repository. Bare data file names (a.json) are left alone:
    usage lines name the user's files.
Tokens with a placeholder or glob (< > * { }) are skipped, e.g. results/<device>/... or
kernels/cuda/*_kernel.cuh. Prints FILE:LINE: PATH (why) for each missing one; exits 1 if any.
Python 3 standard library only.
"""
import argparse
import io
import os
import re
import sys
import tokenize

TOP_DIRS = ("app", "core", "kernels", "reference", "tests", "scripts", "configs", "docs", "results",
            "cmake", ".ci")
SCAN_DIRS = ("app", "core", "kernels", "reference", "tests", "scripts", "cmake", ".ci")
C_EXTS = (".h", ".cpp", ".cu", ".cuh")
HASH_EXTS = (".cmake", ".sh")
OUTSIDE_REPO = {"ALGORITHM.md": "docs/algorithm.md", "DESIGN.md": "docs/design.md",
                "STYLE.md": None}

# A path token: not glued to a preceding word, dot, slash or dash (so fla/ops/x.py or
# kcp_core/x do not count), then a top-level folder and the rest of the path.
PATH_RE = re.compile(r"(?<![\w./\-])((?:%s)/[\w./<>*{}\-]*)" %
                     "|".join(re.escape(d) for d in TOP_DIRS))
BARE_MD_RE = re.compile(r"(?<![\w./\-])([\w\-]+\.md)\b")
BARE_SRC_RE = re.compile(r"(?<![\w./\-<>*{}])([\w\-]+\.(?:h|cpp|cu|cuh|py|sh|cmake))(?![\w/])")
PLACEHOLDER = re.compile(r"[<>*{}]")


def c_comments(text):
    """(line, comment text) of every // and /* */ comment, skipping string and char literals."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2:open_paren]
            j = text.find(")" + delim + '"', open_paren)
            j = n if j < 0 else j + len(delim) + 2
            line += text.count("\n", i, j)
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def hash_comments(text):
    """(line, comment text) for # comments of shell and CMake, skipping quoted strings."""
    out = []
    for lineno, src in enumerate(text.split("\n"), 1):
        quote, i = None, 0
        while i < len(src):
            c = src[i]
            if quote:
                if c == "\\" and quote == '"':
                    i += 1
                elif c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#" and (i == 0 or src[i - 1] in " \t;("):  # not $# or ${#x}
                out.append((lineno, src[i + 1:]))
                break
            i += 1
    return out


def python_comments(text):
    """(line, text) of # comments and of docstrings (a string standing as its own statement)."""
    out, prev = [], tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string[1:]))
            elif tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT,
                                                          tokenize.DEDENT, tokenize.ENCODING):
                for k, part in enumerate(tok.string.split("\n")):
                    out.append((tok.start[0] + k, part))
            if tok.type not in (tokenize.NL, tokenize.COMMENT):
                prev = tok.type
    except (tokenize.TokenError, SyntaxError) as e:
        raise SystemExit("cannot tokenize: %s" % e)
    return out


def comment_kind(path):
    name = os.path.basename(path)
    if name.endswith(C_EXTS):
        return c_comments
    if name.endswith(".py"):
        return python_comments
    if name == "CMakeLists.txt" or name.endswith(HASH_EXTS):
        return hash_comments
    if "." not in name:  # extension-less scripts such as .ci/run
        with open(path, "rb") as f:
            first = f.readline()
        if first.startswith(b"#!") and b"sh" in first:
            return hash_comments
    return None


def files_to_scan(root):
    top = os.path.join(root, "CMakeLists.txt")
    if os.path.isfile(top):
        yield top
    for d in SCAN_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
            dirnames[:] = sorted(x for x in dirnames if not x.startswith("build") and x != "__pycache__")
            for f in sorted(filenames):
                yield os.path.join(dirpath, f)


def repo_basenames(root):
    """Every file name in the repository (for bare source file names)."""
    names = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [x for x in dirnames if x not in (".git", "__pycache__") and not x.startswith("build")]
        names.update(filenames)
    return names


def check_token(root, here, names, token):
    """None when the token names something that exists, else why not. here: the commenting
    file's folder; names: repo_basenames(root)."""
    if "/" in token:
        return None if os.path.exists(os.path.join(root, token.rstrip("/"))) else "no such file or folder"
    if token.endswith(".md"):
        if token in OUTSIDE_REPO:
            better = OUTSIDE_REPO[token]
            return "not in the repository" + (", cite %s" % better if better else "")
        if os.path.isfile(os.path.join(root, token)):
            return None
        if os.path.isfile(os.path.join(root, "docs", token)):
            return "not at the root, write docs/%s" % token
        return "no such file"
    return None if os.path.isfile(os.path.join(here, token)) or token in names else "no such file"


def tokens_in(comment):
    for m in PATH_RE.finditer(comment):
        yield m.group(1).rstrip(".")
    for regex in (BARE_MD_RE, BARE_SRC_RE):
        for m in regex.finditer(comment):
            yield m.group(1)


def check(root):
    problems, names = [], repo_basenames(root)
    for path in files_to_scan(root):
        kind = comment_kind(path)
        if kind is None:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        rel = os.path.relpath(path, root)
        for line, comment in kind(text):
            for token in tokens_in(comment):
                if PLACEHOLDER.search(token):
                    continue
                why = check_token(root, os.path.dirname(path), names, token)
                if why:
                    problems.append("%s:%d: %s (%s)" % (rel, line, token, why))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="repository root (default: the parent of this script's folder)")
    root = os.path.abspath(ap.parse_args().root)
    problems = check(root)
    for p in problems:
        print(p)
    print("%d missing path(s) named in comments" % len(problems), file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
