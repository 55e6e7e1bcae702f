#!/usr/bin/env python3
"""The tree reads as the map says: rooms of one job, documents that stand on
their own.

- No source file of `src/` or `core/src/` (tests aside: a `tests.rs`, or a
  file under a `tests/` folder) is over 900 lines.
- Every relative link in the repository's Markdown documents (README.md,
  ARCHITECTURE.md, BENCHMARKS.md, CHANGELOG.md, docs/, the harness's and the
  examples' READMEs) names a file or folder that exists.
- No document, and no comment in the sources, cites a tracker number
  ("issue 12", "#12") or a file outside the repository (`../shared/`).

Prints what it finds and exits 1 if anything is wrong.
"""

import os
import re
import sys

HERE = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MAX_LINES = 900
SKIP = {"target", ".git", ".venv", "node_modules", "results", "corpus", "artifacts"}
TRACKER = re.compile(r"\bissues? #?\d+\b|(?<![\w&/])#\d{1,4}\b(?![\w-])", re.I)
ISSUE = re.compile(r"\bissues? #?\d+\b", re.I)
COMMENT = {".rs": r"//.*", ".go": r"//.*", ".js": r"//.*", ".html": r"<!--.*|//.*",
           ".py": r"#.*", ".sh": r"#.*", ".toml": r"#.*"}
OUTSIDE = re.compile(r"\.\./shared/|\.\./\.library")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def walk(*roots, ext=()):
    for root in roots:
        root = os.path.join(HERE, root)
        if os.path.isfile(root):
            yield root
            continue
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIP]
            for name in names:
                if name.endswith(ext):
                    yield os.path.join(folder, name)


def rel(path):
    return os.path.relpath(path, HERE)


def is_test(path):
    parts = rel(path).split(os.sep)
    return parts[-1] == "tests.rs" or "tests" in parts[2:-1]


def main():
    problems = []
    for path in walk("src", "core/src", ext=(".rs",)):
        lines = sum(1 for _ in open(path, encoding="utf-8"))
        if lines > MAX_LINES and not is_test(path):
            problems.append(f"{rel(path)}: {lines} lines (at most {MAX_LINES} outside tests)")

    docs = [
        p
        for p in walk("README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "CHANGELOG.md", "docs",
                      "benches", "examples", "fuzz", "autobahn", ext=(".md",))
        if os.path.exists(p)
    ]
    for path in docs:
        text = open(path, encoding="utf-8").read()
        # Code spans and blocks are not links.
        prose = re.sub(r"```.*?```|`[^`\n]*`", "", text, flags=re.S)
        for target in LINK.findall(prose):
            if re.match(r"[a-z]+:|#|mailto:", target):
                continue
            file = target.split("#")[0]
            if file and not os.path.exists(os.path.join(os.path.dirname(path), file)):
                problems.append(f"{rel(path)}: link to {target}, which does not exist")

    sources = list(walk("src", "core/src", "tests", "examples", "benches", "fuzz", ".ci",
                        ext=(".rs", ".py", ".sh", ".go", ".js", ".html", ".toml")))
    for path in docs + sources:
        if os.path.abspath(path) == os.path.abspath(__file__):
            continue
        for number, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
            if path.endswith(".md"):
                cited = TRACKER.search(re.sub(r"`[^`\n]*`", "", line))
            else:
                comment = re.search(COMMENT[os.path.splitext(path)[1]], line)
                cited = comment and ISSUE.search(comment.group(0))
            if cited or OUTSIDE.search(line):
                problems.append(f"{rel(path)}:{number}: cites a tracker number or a file outside: {line.strip()[:100]}")

    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    print("sources within 900 lines, document links resolve, no tracker numbers or outside files cited")
    return 0


if __name__ == "__main__":
    sys.exit(main())
