#!/usr/bin/env python3
# compare.py OUTDIR: every mlagen row of bench.csv with an op (fwd, bwd, fwd_bwd) against every
# peer row of torch.csv with the same op, H, S, widths and mask (causal 1 or 0; a CSV without
# the column counts as causal); writes OUTDIR/compare.csv. Exit 3, writing nothing, when there is
# nothing to compare (no bench.csv rows or no torch.csv rows: run.sh's NOT_RUN).
import csv, os, sys
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name)
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
mine, peer = rows("bench.csv"), rows("torch.csv")
for name, have in (("bench.csv", mine), ("torch.csv", peer)):
    if not have:
        print(f"nothing to compare: no {name} rows in {out}"); sys.exit(3)
lines = []
hdr = f"{'mlagen':<18} {'peer':<20} {'op':<8} {'H':>4} {'S':>6} {'causal':>6} {'d_qk/d_v':>8} {'mlagen ms':>10} {'peer ms':>10} {'ratio':>7} {'mlagen TF/s':>11} {'peer TF/s':>9}"
print(hdr)
with open(os.path.join(out, "compare.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["mlagen", "peer", "op", "H", "S", "causal", "d_qk", "d_v", "mlagen_ms", "peer_ms",
                "ratio_mlagen_over_peer", "mlagen_tflops", "peer_tflops"])
    for m in mine:
        if not m["op"]:
            continue
        for p in peer:
            key = ("op", "H", "S", "d_qk", "d_v", "causal")
            if tuple(p.get(k) or "1" for k in key) != tuple(m.get(k) or "1" for k in key) or not p["ms"]:
                continue
            r = float(m["ms"]) / float(p["ms"])
            w.writerow([m["kernel"], p["impl"], m["op"], m["H"], m["S"], m.get("causal") or "1", m["d_qk"], m["d_v"], m["ms"],
                        p["ms"], f"{r:.3f}", m["tflops"], p["tflops"]])
            print(f"{m['kernel']:<18} {p['impl']:<20} {m['op']:<8} {m['H']:>4} {m['S']:>6} {m.get('causal') or '1':>6} "
                  f"{m['d_qk'] + '/' + m['d_v']:>8} {float(m['ms']):>10.3f} {float(p['ms']):>10.3f} "
                  f"{r:>7.2f} {m['tflops']:>11} {p['tflops']:>9}")
print(f"ratio = mlagen ms / peer ms (< 1: mlagen faster); written {os.path.join(out, 'compare.csv')}")
