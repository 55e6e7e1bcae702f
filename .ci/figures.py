#!/usr/bin/env python3
"""README's benchmark figures are BENCHMARKS.md's.

Every number in README.md's "## Benchmarks" section (a figure, a ratio
such as 5.68x, a count of connections, a date) must appear in
BENCHMARKS.md, which the load harness generates; the section must quote
the report's command and the time it was written. So a run that changes a
figure fails here until README quotes the new one, and README cannot
carry a figure that no report measured.

Python 3, standard library only; run from anywhere.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A number as the report writes it: 850,336 / 5.68 / 0.5 / 2026; with an x
# (or ×) right after it, a ratio, which must appear as a ratio.
NUMBER = re.compile(r"(?<![\d.,])\d+(?:,\d{3})*(?:\.\d+)?(?:x(?![\w]))?")


def numbers(text):
    """The numbers in `text`, × read as x."""
    return NUMBER.findall(text.replace("×", "x"))


def section(text, title):
    """The section under `## title`, to the next `## ` heading."""
    start = text.find(f"\n## {title}\n")
    if start < 0:
        sys.exit(f"figures: README.md has no '## {title}' section")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def main():
    readme = (ROOT / "README.md").read_text()
    report = (ROOT / "BENCHMARKS.md").read_text()
    quoted = section(readme, "Benchmarks")
    # Line breaks and runs of spaces mean nothing to the quotes below.
    flat = " ".join(quoted.split())
    problems = []

    known = set(numbers(report))
    for figure in sorted(set(numbers(quoted)), key=numbers(quoted).index):
        if figure not in known:
            problems.append(f"{figure} is not in BENCHMARKS.md")

    command = re.search(r"```text\n(.*?)\n```", report, re.S)
    if not command:
        problems.append("BENCHMARKS.md has no command block")
    elif command.group(1) not in flat:
        problems.append(f"the section does not quote the report's command: {command.group(1)}")
    written = re.search(r"report written ([0-9-]+ [0-9:]+ UTC)", report)
    if not written:
        problems.append("BENCHMARKS.md does not say when it was written")
    elif written.group(1) not in flat:
        problems.append(f"the section does not say the report was written {written.group(1)}")

    if problems:
        print("figures: README.md's '## Benchmarks' disagrees with BENCHMARKS.md:")
        for problem in problems:
            print(f"  - {problem}")
        print("Quote the report's figures as it prints them (benches/harness/README.md).")
        sys.exit(1)
    print(f"figures: all {len(set(numbers(quoted)))} numbers in README's benchmarks are BENCHMARKS.md's")


if __name__ == "__main__":
    main()
