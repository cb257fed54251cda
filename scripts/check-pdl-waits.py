#!/usr/bin/env python3
"""Checks the contract of programmatic dependent launch (launch_common.cuh):
a kernel launched by launch_kernel() may start before the kernel ahead of it
in the stream has ended, so it must call await_predecessor() before it
touches global memory.

    scripts/check-pdl-waits.py [--root DIR]

In every .cu file under lib/cuda that calls launch_kernel(), each __global__
function's body must open with await_predecessor(); and no kernel may be
launched with <<<...>>> (so that a kernel added to the file later cannot be
launched either way without the wait). Files that do not call
launch_kernel() are not concerned.

Exit codes: 0 the contract holds, 1 it does not (each breach is listed).
"""
import argparse
import os
import re
import sys

LAUNCH = re.compile(r"(?<![\w.])launch_kernel\(")
KERNEL = re.compile(r"__global__[^{;]*?\)\s*\{", re.S)
NAME = re.compile(r"(\w+)\s*\(")
OPENS_WITH_WAIT = re.compile(r"\s*await_predecessor\(\);")


def breaches(path, text):
    if not LAUNCH.search(text):
        return []
    found = []
    for m in re.finditer(r"<<<", text):
        found.append(f"{path}:{text.count(chr(10), 0, m.start()) + 1}: a <<<>>> launch in a file that uses launch_kernel()")
    for m in KERNEL.finditer(text):
        if not OPENS_WITH_WAIT.match(text, m.end()):
            line = text.count("\n", 0, m.start()) + 1
            name = [n for n in NAME.findall(m.group(0)) if n != "__launch_bounds__"][0]
            found.append(f"{path}:{line}: kernel {name} does not open with await_predecessor();")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    found, files = [], 0
    for top, _, names in os.walk(os.path.join(args.root, "lib", "cuda")):
        for name in sorted(names):
            if name.endswith(".cu"):
                path = os.path.join(top, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                files += bool(LAUNCH.search(text))
                found += breaches(os.path.relpath(path, args.root), text)
    for line in found:
        print(line)
    if found:
        return 1
    print(f"every kernel of the {files} files that use launch_kernel() waits for its predecessor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
