#!/usr/bin/env python3
"""Checks a `faultline vcd` waveform with an independent VCD reader (pyvcd's tokenizer).

Usage: vcd_check.py FILE.vcd --signal mxu.pe_3_5.psum --cycle 1094 --bit 30

The file holds every shown register twice, `golden.<signal>` and `faulty.<signal>`, one time
unit per cycle of the step. For a single-bit flip of `<signal>` at `--cycle` in `--bit`, this
checks that
  * the two copies are equal at every time before the cycle,
  * at the cycle they differ in exactly that bit (golden XOR faulty == 1 << bit),
  * `trial.fault` (if present) is 1 at the cycle,
and reports where the difference goes next: the first time after the cycle at which another
golden/faulty pair differs, and the last time any pair differs. Exit status: 0 when every check
holds, 1 when one fails, 2 for a file or signal that cannot be read.
"""

import argparse
import bisect
import sys

from vcd.reader import TokenKind, tokenize


class Waves:
    """Every variable of a VCD file by its dotted name, with its value changes."""

    def __init__(self, path):
        self.vars = {}  # dotted name -> (id code, width)
        self.changes = {}  # id code -> ([times], [values]); a value is an int, None for x/z
        self.first = None
        self.last = None
        scopes = []
        time = 0
        with open(path, "rb") as f:
            for tok in tokenize(f):
                kind = tok.kind
                if kind is TokenKind.SCOPE:
                    scopes.append(tok.scope.ident)
                elif kind is TokenKind.UPSCOPE:
                    scopes.pop()
                elif kind is TokenKind.VAR:
                    v = tok.var
                    self.vars[".".join(scopes + [v.reference])] = (v.id_code, v.size)
                    self.changes.setdefault(v.id_code, ([], []))
                elif kind is TokenKind.CHANGE_TIME:
                    time = tok.time_change
                    self.first = time if self.first is None else self.first
                    self.last = time
                elif kind is TokenKind.CHANGE_SCALAR:
                    c = tok.scalar_change
                    self._set(c.id_code, time, int(c.value) if c.value in ("0", "1") else None)
                elif kind is TokenKind.CHANGE_VECTOR:
                    c = tok.vector_change
                    self._set(c.id_code, time, c.value if isinstance(c.value, int) else None)

    def _set(self, code, time, value):
        times, values = self.changes.setdefault(code, ([], []))
        if times and times[-1] == time:
            values[-1] = value
        else:
            times.append(time)
            values.append(value)

    def times(self, name):
        """The times `name` changes at."""
        return self.changes[self.vars[name][0]][0]

    def at(self, name, t):
        """The value of `name` at time `t` (None before its first change, or x)."""
        times, values = self.changes[self.vars[name][0]]
        i = bisect.bisect_right(times, t) - 1
        return values[i] if i >= 0 else None

    def pairs(self):
        """Every shown signal: the names that exist under both `golden.` and `faulty.`."""
        golden = {n[len("golden."):] for n in self.vars if n.startswith("golden.")}
        return sorted(s for s in golden if "faulty." + s in self.vars)


def differs(w, s, t):
    g, f = w.at("golden." + s, t), w.at("faulty." + s, t)
    return g is not None and f is not None and g != f


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vcd")
    ap.add_argument("--signal", required=True, help="a shown register, e.g. mxu.pe_3_5.psum")
    ap.add_argument("--cycle", required=True, type=int, help="the cycle the flip strikes (step clock)")
    ap.add_argument("--bit", required=True, type=int, help="the flipped bit")
    a = ap.parse_args()

    try:
        w = Waves(a.vcd)
    except (OSError, ValueError) as e:
        print(f"vcd_check: {a.vcd}: {e}", file=sys.stderr)
        return 2
    g, f = "golden." + a.signal, "faulty." + a.signal
    missing = [n for n in (g, f) if n not in w.vars]
    if missing:
        print(f"vcd_check: {a.vcd} has no {' or '.join(missing)}; signals: {', '.join(w.pairs()[:8])} ...",
              file=sys.stderr)
        return 2
    width = w.vars[g][1]
    print(f"{a.vcd}: {len(w.pairs())} golden/faulty pairs, times {w.first}..{w.last}; "
          f"{a.signal} is {width} bits")

    ok = True

    def bad(msg):
        nonlocal ok
        ok = False
        print("FAIL: " + msg)

    if not (w.first <= a.cycle <= w.last):
        bad(f"cycle {a.cycle} is outside the file's times {w.first}..{w.last}")
        return 1
    if not 0 <= a.bit < width:
        bad(f"bit {a.bit} is outside the {width}-bit register")
        return 1

    # Equal before the cycle: at every time either copy changes, and at the first time.
    before = sorted({t for t in w.times(g) + w.times(f) if t < a.cycle} | {w.first})
    before = [t for t in before if t < a.cycle]
    unequal = [t for t in before if w.at(g, t) != w.at(f, t)]
    if unequal:
        t = unequal[0]
        bad(f"{a.signal} differs before cycle {a.cycle}: at {t} golden {w.at(g, t)}, faulty {w.at(f, t)}")
    else:
        print(f"ok: golden and faulty {a.signal} are equal at every time before {a.cycle} "
              f"({len(before)} times checked)")

    gv, fv = w.at(g, a.cycle), w.at(f, a.cycle)
    if gv is None or fv is None:
        bad(f"{a.signal} is unknown (x) at cycle {a.cycle}")
    elif gv ^ fv != 1 << a.bit:
        bad(f"at cycle {a.cycle} golden {gv:#x} and faulty {fv:#x} differ in {gv ^ fv:#x}, "
            f"not exactly bit {a.bit} ({1 << a.bit:#x})")
    else:
        print(f"ok: at cycle {a.cycle} golden {gv:#x} and faulty {fv:#x} differ in exactly bit {a.bit}")

    if "trial.fault" in w.vars:
        if w.at("trial.fault", a.cycle) != 1:
            bad(f"trial.fault is not 1 at cycle {a.cycle}")
        else:
            print(f"ok: trial.fault marks cycle {a.cycle}")

    # Where the difference goes: every time any pair changes, from the cycle on.
    pairs = w.pairs()
    times = sorted({t for s in pairs for n in ("golden." + s, "faulty." + s) for t in w.times(n) if t >= a.cycle})
    spread, last = None, None
    for t in times:
        diff = [s for s in pairs if differs(w, s, t)]
        if diff:
            last = t
        others = [s for s in diff if s != a.signal]
        if t > a.cycle and others and spread is None:
            spread = (t, others)
    if spread:
        t, others = spread
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        print(f"first divergence after {a.cycle}: at {t}, {', '.join(others[:3])}{more}")
    else:
        print(f"the difference reaches no other shown register after {a.cycle}")
    if last is not None:
        print(f"last time any golden/faulty pair differs: {last}")

    print("vcd_check: " + ("all checks hold" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
