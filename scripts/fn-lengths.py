#!/usr/bin/env python3
"""Lists Rust functions by length (lines from `fn` to its closing brace), longest first.

    scripts/fn-lengths.py [--min N] [--max N] [--tests] DIR...

--min N   list only functions longer than N lines (default 100)
--max N   exit 1 when a function is longer than N lines (the team's limit is 150)
--tests   include tests/, examples/ and #[cfg(test)] modules (left out by default)

Braces are counted after removing strings, character literals and line comments: good enough
for this codebase's style, not a Rust parser (a raw string holding an unbalanced brace would
miscount).
"""
import os
import re
import sys

FN = re.compile(
    r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+(\w+)'
)


def code_of(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def lengths(path, include_tests):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    end = len(lines)
    if not include_tests:
        end = next((n for n, l in enumerate(lines) if l.startswith("#[cfg(test)]")), end)
    for n in range(end):
        m = FN.match(lines[n])
        if not m:
            continue
        depth, started = 0, False
        for k in range(n, len(lines)):
            code = code_of(lines[k])
            if not started and ";" in code and "{" not in code:
                break  # a declaration without a body
            depth += code.count("{") - code.count("}")
            started = started or "{" in code
            if started and depth <= 0:
                yield k - n + 1, n + 1, m.group(7)
                break


def main(argv):
    minimum, maximum, include_tests, dirs = 100, None, False, []
    args = iter(argv)
    for a in args:
        if a == "--min":
            minimum = int(next(args))
        elif a == "--max":
            maximum = int(next(args))
        elif a == "--tests":
            include_tests = True
        else:
            dirs.append(a)
    found = []
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs[:] = [
                s
                for s in subdirs
                if s != "target" and (include_tests or s not in ("tests", "examples"))
            ]
            for f in files:
                if f.endswith(".rs"):
                    p = os.path.join(root, f)
                    found += [(n, p, line, name) for n, line, name in lengths(p, include_tests)]
    found.sort(reverse=True)
    over = 0
    for n, p, line, name in found:
        if n > minimum:
            print(f"{n:5} {p}:{line} {name}")
        if maximum is not None and n > maximum:
            over += 1
    if over:
        print(f"{over} function(s) longer than {maximum} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
