#!/usr/bin/env python3
"""A documentation page's commands and outputs, for e2e/getting-started.sh.

  page.py blocks PAGE OUTDIR   writes OUTDIR/NN.sh for each ```sh block, in order, and
                               OUTDIR/NN.expect for a ```text block right after it; stops
                               at an HTML comment that says the runner stops there.
  page.py match EXPECT ACTUAL  exit 0 when ACTUAL shows EXPECT: whitespace runs match any
                               whitespace, `...` any text on its line, a line `...` any lines.
"""
import re
import sys


def blocks(page, outdir):
    text = open(page, encoding="utf-8").read()
    stop = text.find("<!-- e2e/getting-started.sh stops here")
    if stop >= 0:
        text = text[:stop]
    fence = re.compile(r"^```(\w*)\n(.*?)^```\n(\s*)", re.S | re.M)
    n = 0
    last_sh = None
    last_end = -1
    for m in fence.finditer(text):
        lang, body = m.group(1), m.group(2)
        if lang == "sh":
            n += 1
            last_sh, last_end = n, m.end()
            open(f"{outdir}/{n:02}.sh", "w", encoding="utf-8").write(body)
        elif lang == "text" and last_sh is not None and m.start() == last_end:
            open(f"{outdir}/{last_sh:02}.expect", "w", encoding="utf-8").write(body)
    print(n)


def pattern(expect):
    parts = []
    for line in expect.strip("\n").split("\n"):
        line = line.strip()
        if line == "...":
            parts.append(r"(?:.*\n)*?")
            continue
        words = [re.escape(w) if w != "..." else ".*?" for w in re.split(r"\s+", line)]
        words = [w.replace(r"\.\.\.", ".*?") for w in words]
        parts.append(r"^[ \t]*" + r"[ \t]+".join(words) + r"[ \t]*\n")
    return re.compile("".join(parts), re.M)


def match(expect_path, actual_path):
    expect = open(expect_path, encoding="utf-8").read()
    actual = open(actual_path, encoding="utf-8").read()
    if not actual.endswith("\n"):
        actual += "\n"
    if pattern(expect).search(actual):
        return 0
    sys.stderr.write(f"expected (from the page):\n{expect}\ngot:\n{actual}")
    return 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["blocks"] and len(sys.argv) == 4:
        blocks(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["match"] and len(sys.argv) == 4:
        sys.exit(match(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
