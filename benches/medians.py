#!/usr/bin/env python3
"""The medians of benches/alternate.sh's per-round ratios, from its rows on standard input.

Each round ran HAProxy, A and B back to back, so a ratio within a round compares them under the
same load on the machine; the median over rounds is the figure to report (a noisy round moves it
little). Printed per figure: the median of A / HAProxy, B / HAProxy and B / A, the interval
that holds the true median with at least 95 % confidence (from the order statistics: no
assumption about how the noise is distributed; needs 6 rounds or more), and the rounds.
Lower is better for every figure but req/s. Rows of an unfinished round are left out.
Running the same binary as A and B shows what the sitting's noise alone makes of B / A.

    python3 benches/medians.py < rows
"""
import math
import re
import statistics
import sys

ROW = re.compile(r"(\d+) (\w+)\s+(.*)")
FIELD = re.compile(r"(\w+)=(\S+)")


def value(key, text):
    """A field's value as a number: latencies in ms (wrk prints us, ms or s)."""
    if key in ("p50", "p99"):
        m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
        return float(m.group(1)) * scale
    return float(text)


def interval(sorted_values):
    """The distribution-free 95 % confidence interval of the median: the k-th smallest and k-th
    largest value, k the largest with P(Binomial(n, 1/2) < k) <= 2.5 %; None under 6 values."""
    n = len(sorted_values)
    k, below = 0, 0.0
    while True:
        below_next = below + math.comb(n, k) / 2**n
        if below_next > 0.025:
            break
        below, k = below_next, k + 1
    if k == 0:
        return None
    return sorted_values[k - 1], sorted_values[n - k]


def main():
    rounds = {}
    for line in sys.stdin:
        m = ROW.match(line.strip())
        if not m:
            continue
        fields = {k: value(k, v) for k, v in FIELD.findall(m.group(3))}
        rounds.setdefault(int(m.group(1)), {})[m.group(2)] = fields
    done = [r for _, r in sorted(rounds.items()) if {"haproxy", "a", "b"} <= r.keys()]
    if not done:
        print("no complete round")
        return
    print(f"medians over {len(done)} rounds")
    for key in ("cpu", "user", "sys", "rps", "p50", "p99"):
        for top, bottom in (("a", "haproxy"), ("b", "haproxy"), ("b", "a")):
            ratios = [r[top][key] / r[bottom][key] for r in done
                      if key in r[top] and key in r[bottom] and r[bottom][key] > 0]
            if ratios:
                ci = interval(sorted(ratios))
                ci = f"({ci[0]:.2f}-{ci[1]:.2f})" if ci else "(too few)"
                shown = " ".join(f"{x:.2f}" for x in ratios)
                median = statistics.median(ratios)
                print(f"{key:4} {top}/{bottom[0]} {median:.2f} {ci:11}  [{shown}]")


main()
