#!/usr/bin/env python3
"""Lists functions longer than a limit (default 100 lines) in the library, the
tools and the Python module, and exits 1 if any is not exempt.

    scripts/check-function-length.py [--limit N] [--root DIR] [--exempt FILE] [--all]

Functions are found and measured by lizard (PyPI; scripts/setup.sh --test puts
it in build/venv): a function's length runs from the first line of its
declaration to its last line, lambdas and local classes included in the
function that holds them.

The exemption file lists `path:function` one per line, each with a comment
saying why; an entry that no longer matches a long function is reported too,
so the list cannot outlive its reasons.

Exit codes: 0 none over the limit (or all exempt), 1 some, 3 lizard missing.
"""
import argparse
import os
import sys

SOURCE_DIRS = ("lib", "tools", "python")
EXTENSIONS = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".cc", ".py")
SKIP_DIRS = ("build", "__pycache__")


def read_exemptions(path):
    exempt = {}
    if not path or not os.path.exists(path):
        return exempt
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            entry = raw.split("#", 1)[0].strip()
            if entry:
                exempt[entry] = number
    return exempt


def source_files(root):
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
            for fn in sorted(filenames):
                if fn.endswith(EXTENSIONS):
                    path = os.path.join(dirpath, fn)
                    yield path, os.path.relpath(path, root)


def long_functions(root, limit):
    """(relative path, first line, name, length) of every function over `limit` lines."""
    import lizard

    found = []
    for path, rel in source_files(root):
        for f in lizard.analyze_file(path).function_list:
            # lizard names a method Class::name; the exemption file, like the
            # reader, uses the last part.
            name = f.name.split("::")[-1]
            if f.length > limit:
                found.append((rel, f.start_line, name, f.length))
    return found


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=os.path.dirname(here))
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--exempt", default=os.path.join(here, "function-length-exempt.txt"))
    p.add_argument("--all", action="store_true", help="list every function over the limit, exempt or not")
    args = p.parse_args()
    try:
        offenders = long_functions(args.root, args.limit)
    except ImportError:
        print("check-function-length: lizard is missing (pip install lizard; scripts/setup.sh --test puts it in "
              "build/venv)", file=sys.stderr)
        return 3

    exempt = read_exemptions(args.exempt)
    used = {f"{rel}:{name}" for rel, _, name, _ in offenders} & set(exempt)
    bad = [o for o in offenders if f"{o[0]}:{o[2]}" not in exempt]
    for rel, first, name, length in offenders if args.all else bad:
        note = " (exempt)" if f"{rel}:{name}" in exempt else ""
        print(f"{rel}:{first}: {name} is {length} lines (limit {args.limit}){note}")
    stale = sorted(set(exempt) - used)
    for key in stale:
        print(f"{args.exempt}:{exempt[key]}: '{key}' is exempt but is no longer a function over {args.limit} lines "
              "(remove the entry)")
    if bad or stale:
        print(f"{len(bad)} function(s) over {args.limit} lines: cut them along their own headings into named "
              "stages, or exempt a generated table in " + os.path.relpath(args.exempt, args.root), file=sys.stderr)
        return 1
    print(f"no function over {args.limit} lines ({len(exempt)} exempt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
