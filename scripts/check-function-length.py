#!/usr/bin/env python3
"""Lists functions longer than a limit (default 100 lines) in the library, the
tools and the Python module, and exits 1 if any is not exempt.

    scripts/check-function-length.py [--limit N] [--root DIR] [--exempt FILE]

A function's length runs from the first line of its declaration to its closing
brace. C++ and CUDA are read with a brace-matching heuristic: comments, string
and character literals and preprocessor lines are blanked, then a `{` outside
any function opens a function body when the text before it ends in a
parameter list (with qualifiers, a trailing return type or a constructor's
initialiser list); class, namespace and data braces (tables) never do.
Lambdas and local classes count toward the function that holds them.
Python files are measured with the ast module.

The exemption file lists `path:function` one per line, each with a comment
saying why; an entry that no longer matches a long function is reported too,
so the list cannot outlive its reasons.
"""
import argparse
import ast
import os
import re
import sys

SOURCE_DIRS = ("lib", "tools", "python")
CPP_EXT = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".cc")
CONTROL = {"if", "for", "while", "switch", "catch", "do", "else", "try", "return", "sizeof", "alignof", "decltype"}
QUALIFIER = re.compile(
    r"(\s*(const|volatile|noexcept(\s*\([^()]*\))?|override|final|mutable|constexpr|&&|&|"
    r"__device__|__host__|__global__|__forceinline__|try))*\s*$"
)


def blank(text):
    """Comments, literals and preprocessor lines replaced by spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # A directive, with its continuation lines.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                j = n if end < 0 else end + len(m.group(1)) + 2
                out.append(re.sub(r"[^\n]", " ", text[i:j]))
                i = j
                continue
        if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000 digit separators
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
            continue
        out.append(c)
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        i += 1
    return "".join(out)


def matching_open(text, close):
    """Index of the '(' that the ')' at `close` closes, or -1."""
    depth = 0
    for k in range(close, -1, -1):
        if text[k] == ")":
            depth += 1
        elif text[k] == "(":
            depth -= 1
            if depth == 0:
                return k
    return -1


def function_name(head):
    """The function's name if `head` (the text before a '{') ends in a
    function's declarator, else None."""
    h = head.rstrip()
    # A constructor's initialiser list: cut at the ':' that follows the parameter list.
    m = re.search(r"\)\s*(noexcept(\s*\([^()]*\))?\s*)?:(?!:)", h)
    if m and not re.search(r"\b(case|public|private|protected)\s*:", h):
        if not h.endswith((")", "}")):
            return None  # a member's braced initialiser inside the list, not the body
        h = h[: m.start() + 1]
    h = QUALIFIER.sub("", h)
    # A trailing return type.
    m = re.search(r"\)\s*(const\s*|noexcept\s*|mutable\s*)*->[^()]*$", h)
    if m:
        h = h[: m.start() + 1]
    # A requires clause after the parameters.
    m = re.search(r"\)\s*requires\b", h)
    if m:
        h = h[: m.start() + 1]
    if not h.endswith(")"):
        return None
    open_paren = matching_open(h, len(h) - 1)
    if open_paren <= 0:
        return None
    before = h[:open_paren].rstrip()
    if before.endswith("]"):  # a lambda: [captures](params)
        m = re.search(r"(\w+)\s*=\s*\[[^\]]*\]$", before)
        return "lambda " + (m.group(1) if m else "")
    if before.endswith(">") and "operator" not in before[-12:]:
        # __launch_bounds__(...) or a template argument list before the parameters is rare; go past a
        # `__launch_bounds__(n)` annotation.
        pass
    m = re.search(r"(operator\s*(\(\)|[^\w\s(]+|\w+)|~?[A-Za-z_]\w*)\s*$", before)
    if not m:
        return None
    name = m.group(1)
    if name in CONTROL or name.startswith("__launch_bounds__"):
        return None
    # Qualified names: Class::method.
    q = re.search(r"((?:[A-Za-z_]\w*(?:<[^<>]*>)?::)+)\s*$", before[: m.start()])
    if q:
        name = re.sub(r"<[^<>]*>", "", q.group(1)) + name
    # Declarations at namespace scope that are not functions: `x = f(a) {` cannot happen, but
    # `T name = T(args)` followed by an initializer brace can; an '=' before the name rules it out.
    if re.search(r"=\s*$", before[: m.start()]):
        return None
    return name


def cpp_functions(text):
    """(name, first_line, last_line) of each outermost function body."""
    code = blank(text)
    line_of = []
    line = 1
    for ch in code:
        line_of.append(line)
        if ch == "\n":
            line += 1
    found = []
    stack = []  # kinds of the open braces outside functions: 'scope' or 'data'
    head_start = 0
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == ";":
            head_start = i + 1
        elif c == "}":
            if stack:
                kind = stack.pop()
                if kind != "data":
                    head_start = i + 1
        elif c == "{":
            head = code[head_start:i]
            name = function_name(head)
            if name is None and stack and stack[-1] == "data":
                name = None
            if name is not None and not re.search(r"\b(class|struct|union|enum|namespace)\b[^()]*$", head):
                # Find the end of the body.
                depth, j = 0, i
                while j < n:
                    if code[j] == "{":
                        depth += 1
                    elif code[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    j += 1
                first = head_start + (len(head) - len(head.lstrip()))
                found.append((name, line_of[min(first, n - 1)], line_of[min(j, n - 1)]))
                i = j + 1
                head_start = i
                continue
            stripped = head.rstrip()
            if re.search(r"\b(class|struct|union|namespace)\b", head) or re.search(r'extern\s+"', head) or not stripped:
                stack.append("scope")
                head_start = i + 1
            else:
                # A braced initialiser or table: its contents are data, the head goes on.
                stack.append("data")
        i += 1
    return found


def python_functions(text, path):
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            found.append((node.name, first, node.end_lineno))
    return found


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


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=os.path.dirname(here))
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--exempt", default=os.path.join(here, "function-length-exempt.txt"))
    p.add_argument("--all", action="store_true", help="list every function over the limit, exempt or not")
    args = p.parse_args()

    exempt = read_exemptions(args.exempt)
    used = set()
    offenders = []
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(args.root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in ("build", "__pycache__"))
            for fn in sorted(filenames):
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, args.root)
                if fn.endswith(CPP_EXT):
                    with open(path, encoding="utf-8", errors="replace") as f:
                        funcs = cpp_functions(f.read())
                elif fn.endswith(".py"):
                    with open(path, encoding="utf-8", errors="replace") as f:
                        funcs = python_functions(f.read(), path)
                else:
                    continue
                for name, first, last in funcs:
                    length = last - first + 1
                    if length <= args.limit:
                        continue
                    key = f"{rel}:{name}"
                    if key in exempt:
                        used.add(key)
                        if not args.all:
                            continue
                    offenders.append((rel, first, name, length, key in exempt))

    bad = [o for o in offenders if not o[4]]
    for rel, first, name, length, is_exempt in offenders:
        note = " (exempt)" if is_exempt else ""
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
