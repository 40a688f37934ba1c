# Summarise an ncu "--page source --csv --print-source=sass" export: total instructions executed,
# top instructions by executed count, and stall-sample totals per reason.
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = None
for i, r in enumerate(rows):
    if "Source" in r and any("Instructions Executed" in c for c in r):
        hdr = i; break
h = rows[hdr]; data = rows[hdr + 1:]
ci = {c: j for j, c in enumerate(h)}
def num(x):
    try: return float(x.replace(",", ""))
    except: return 0.0
ie = [j for c, j in ci.items() if c.startswith("Instructions Executed")][0]
src = ci["Source"]; addr = ci.get("Address", 0)
samp = [j for c, j in ci.items() if c.startswith("Warp Stall Sampling (All")]
tot = sum(num(r[ie]) for r in data if len(r) > ie)
print("total warp instructions executed", tot)
if samp:
    st = sum(num(r[samp[0]]) for r in data if len(r) > samp[0]); print("total stall samples", st)
top = sorted([r for r in data if len(r) > ie], key=lambda r: -num(r[ie]))[:int(sys.argv[2]) if len(sys.argv) > 2 else 50]
for r in top:
    print(r[addr], int(num(r[ie])), int(num(r[samp[0]])) if samp else "", r[src][:80])
# by sample count
print("--- top by stall samples")
if samp:
    for r in sorted([r for r in data if len(r) > samp[0]], key=lambda r: -num(r[samp[0]]))[:40]:
        print(r[addr], int(num(r[ie])), int(num(r[samp[0]])), r[src][:80])
stall_cols = [(c, j) for c, j in ci.items() if c.startswith("stall_") or "Stall" in c]
# Samples and instructions in address order, in buckets of 48 instructions (first instruction shown).
print("--- buckets (address order): samples, instructions executed, first instruction")
rs = [r for r in data if len(r) > ie]
for b in range(0, len(rs), 48):
    chunk = rs[b:b + 48]
    s_ = sum(num(r[samp[0]]) for r in chunk) if samp else 0
    i_ = sum(num(r[ie]) for r in chunk)
    if s_ >= 10 or i_ >= 200000:
        print(b, int(s_), int(i_), chunk[0][src][:60])
