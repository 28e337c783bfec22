#!/usr/bin/env python3
"""ncu-lines.py: where a kernel's warps stood, by line of the templates.

Joins Nsight Compute's source page of one kernel (PC sampling by SASS
instruction: `ncu -i R --page source --csv --print-source sass`, as
scripts/ncu-rank.sh collects it) with the disassembly of the same cubin
with its line table (`nvdisasm -g -c`; the kernels compiled with
SYMM_JIT_LINEINFO=1, whose generated source carries #line directives into
templates/), and prints:
  - the samples by stall reason, over the kernel;
  - the source lines with the most samples, each with its main reasons;
  - the hottest instructions, each with the instructions before it.

  ncu-lines.py SASS_CSV --sass FILE          the disassembly, already made
  ncu-lines.py SASS_CSV --elf-dir DIR        every *.elf under DIR (SYMM_JIT_DUMP=1
                                             writes them beside the cache's
                                             entries) through nvdisasm; the
                                             kernel is the function whose
                                             instructions are the CSV's
Options: --lines N (30), --hot N (8), --context N (8 instructions).
Exit status: 0 printed; 1 no disassembly matches the CSV; 2 usage or input.
"""
import argparse
import csv
import glob
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict

STALL = "smsp__pcsamp_warps_issue_stalled_"


def fail(msg, code=2):
    print("ncu-lines.py: " + msg, file=sys.stderr)
    sys.exit(code)


def read_csv(path):
    """(kernel, [(address, text, {reason: samples})]) from ncu's source CSV."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        fail("%s: %s" % (path, e.strerror))
    kernel = None
    for i, r in enumerate(rows):
        if len(r) >= 2 and r[0] == "Kernel Name":
            kernel = r[1]
        if "Address" in r and "Source" in r:
            hdr, body = r, rows[i + 1:]
            break
    else:
        fail("%s: no header with Address and Source (expected ncu --page source --csv --print-source sass)" % path)
    ia, isrc = hdr.index("Address"), hdr.index("Source")
    reasons = [(j, h[len(STALL):]) for j, h in enumerate(hdr) if h.startswith(STALL)]
    if not reasons:
        fail("%s: no %s* column (collect the stall reasons by name: scripts/ncu-rank.sh)" % (path, STALL))
    out = []
    for r in body:
        if r and r[0] == "Kernel Name":  # the next kernel's page (another rank's)
            break
        if len(r) != len(hdr):
            continue
        counts = {}
        for j, name in reasons:
            v = r[j].replace(",", "").strip()
            counts[name] = int(float(v)) if v else 0
        out.append((r[ia], r[isrc].strip(), counts))
    if not out:
        fail("%s: no instruction rows" % path)
    return kernel, out


INS = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LINE = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
FUNC = re.compile(r"\s*\.text\.([A-Za-z_$][\w$]*):")


def parse_sass(text):
    """{function: [(offset, text, (file, line))]} from `nvdisasm -g -c`."""
    funcs, cur, where = {}, None, ("?", 0)
    for line in text.splitlines():
        m = FUNC.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            where = ("?", 0)
            continue
        m = LINE.match(line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = INS.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2), where))
    return funcs


def opcode(text):
    t = text.strip().rstrip(";").split()
    if t and t[0].startswith("@"):  # a predicate
        t = t[1:]
    return t[0] if t else ""


def matches(ins, rows):
    return len(ins) == len(rows) and all(opcode(i[1]) == opcode(r[1]) for i, r in zip(ins, rows))


def find_function(funcs, kernel, rows):
    named = [funcs[kernel]] if kernel in funcs else []
    for ins in named + [f for k, f in funcs.items() if k != kernel]:
        if matches(ins, rows):
            return ins
    return None


def disassemble(elf_dir):
    tool = os.environ.get("NVDISASM") or shutil.which("nvdisasm") or "/usr/local/cuda/bin/nvdisasm"
    if not os.access(tool, os.X_OK):
        fail("no nvdisasm (%s): set NVDISASM" % tool)
    for elf in sorted(glob.glob(os.path.join(elf_dir, "**", "*.elf"), recursive=True)):
        p = subprocess.run([tool, "-g", "-c", elf], capture_output=True, text=True)
        if p.returncode == 0:
            yield elf, p.stdout


def top_reasons(c, n=3):
    tot = sum(c.values()) or 1
    return ", ".join("%s %d%%" % (k, round(100.0 * v / tot)) for k, v in c.most_common(n) if v)


def main():
    ap = argparse.ArgumentParser(description="PC samples of ncu's source page by template line.")
    ap.add_argument("csv")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--sass", help="nvdisasm -g -c output of the kernel's cubin")
    g.add_argument("--elf-dir", help="a directory of cubins (*.elf) to search")
    ap.add_argument("--lines", type=int, default=30)
    ap.add_argument("--hot", type=int, default=8)
    ap.add_argument("--context", type=int, default=8)
    o = ap.parse_args()
    kernel, rows = read_csv(o.csv)
    ins, source = None, None
    if o.sass:
        try:
            with open(o.sass) as f:
                ins = find_function(parse_sass(f.read()), kernel, rows)
        except OSError as e:
            fail("%s: %s" % (o.sass, e.strerror))
        source = o.sass
    else:
        for elf, text in disassemble(o.elf_dir):
            ins = find_function(parse_sass(text), kernel, rows)
            if ins:
                source = elf
                break
    if not ins:
        fail("no function in %s has the %d instructions of %s's CSV (kernel %s)"
             % (o.sass or o.elf_dir + "/*.elf", len(rows), o.csv, kernel), 1)

    total = Counter()
    by_line, line_reasons = Counter(), defaultdict(Counter)
    for (addr, text, c), (off, _, where) in zip(rows, ins):
        n = sum(c.values())
        total.update(c)
        by_line[where] += n
        line_reasons[where].update(c)
    all_samples = sum(total.values()) or 1
    print("kernel %s: %d instructions, %d samples; disassembly %s" % (kernel, len(rows), all_samples, source))
    print("by stall reason:")
    for k, v in total.most_common():
        if v:
            print("  %-20s %7d %5.1f%%" % (k, v, 100.0 * v / all_samples))
    print("by source line (the %d with the most samples):" % o.lines)
    for (f, l), v in by_line.most_common(o.lines):
        if v:
            print("  %7d %5.1f%%  %s:%d  (%s)" % (v, 100.0 * v / all_samples, f, l, top_reasons(line_reasons[(f, l)])))
    print("hottest instructions (with the %d before each):" % o.context)
    sums = [sum(r[2].values()) for r in rows]
    for i in sorted(range(len(rows)), key=lambda i: -sums[i])[:o.hot]:
        if not sums[i]:
            break
        print("  -- %d samples (%s) at %04x, %s:%d" % (sums[i], top_reasons(Counter(rows[i][2])), ins[i][0], *ins[i][2]))
        for j in range(max(0, i - o.context), min(len(rows), i + 2)):
            print("  %s %04x %6d  %-58s %s:%d" % ("=>" if j == i else "  ", ins[j][0], sums[j], ins[j][1][:58], *ins[j][2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
