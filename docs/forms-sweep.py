#!/usr/bin/env python3
"""Prints docs/forms.md's sweep tables from `mlagen plan --json`.

  docs/forms-sweep.py [path/to/mlagen]          each form's figures relative to explicit
                                                for DeepSeek-V3 over S and P
  docs/forms-sweep.py [path/to/mlagen] --times  predicted forward + backward time per form,
                                                DeepSeek-V3 and Kimi K2, S 16k/32k/128k,
                                                P 4..64 (those dividing H), NVLink-class
                                                and InfiniBand-class links, and the fastest
                                                form within the default memory budget

(default build/mlagen). The time model and its defaults: docs/forms.md, "Predicted time".
"""
import argparse
import json
import subprocess

parser = argparse.ArgumentParser(
    description="Prints docs/forms.md's sweep tables from `mlagen plan --json`.",
    epilog='The time model and its defaults: docs/forms.md, "Predicted time".')
parser.add_argument("mlagen", nargs="?", default="build/mlagen",
                    help="the mlagen binary (default build/mlagen)")
parser.add_argument("--times", action="store_true",
                    help="predicted forward + backward time per form, DeepSeek-V3 and Kimi K2, "
                         "S 16k/32k/128k, P 4..64, NVLink- and InfiniBand-class links, and the "
                         "fastest form within the default memory budget (default: each form's "
                         "figures relative to explicit for DeepSeek-V3 over S and P)")
opts = parser.parse_args()
mlagen = opts.mlagen
forms = ["explicit", "absorbed", "laga", "laga-r", "laga-f", "laga-cp"]


def plan(model, S, P, *extra):
    out = subprocess.run([mlagen, "plan", "--model", model, "--seq", str(S), "--sp", str(P),
                          "--json", *extra], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def ratios():
    print("| S | P | explicit sent fwd+bwd (MiB) | explicit saved (MiB) | "
          + " | ".join(f"{f} sent / saved / peak bwd" for f in forms[1:]) + " |")
    print("|---|---|---|---|" + "---|" * (len(forms) - 1))
    for S in (4096, 8192, 16384):
        for P in (4, 8, 16):
            f = plan("deepseek-v3", S, P)["forms"]
            ex = f["explicit"]
            sent = lambda x: x["sent_fwd_bytes"] + x["sent_bwd_bytes"]
            cells = []
            for name in forms[1:]:
                x = f[name]
                cells.append(f"{sent(x) / sent(ex):.2f} / {x['saved_bytes'] / ex['saved_bytes']:.2f}"
                             f" / {x['peak_bwd_bytes'] / ex['peak_bwd_bytes']:.2f}")
            print(f"| {S} | {P} | {sent(ex) / 2**20:.1f} | {ex['saved_bytes'] / 2**20:.1f} | "
                  + " | ".join(cells) + " |")


def times():
    links = [("NVLink 450", 450), ("IB NDR 50", 50)]
    models = [("deepseek-v3", "DeepSeek-V3", 128), ("kimi-k2", "Kimi K2", 64)]
    print("| model | S | P | link (GB/s) | " + " | ".join(forms)
          + " | explicit comm share | fastest within 131 GiB (peak GiB) |")
    print("|---|---|---|---|" + "---|" * len(forms) + "---|---|")
    for model, label, H in models:
        for S in (16384, 32768, 131072):
            for P in (4, 8, 16, 32, 64):
                if H % P:
                    continue
                for lname, gbps in links:
                    j = plan(model, S, P, "--link-gbps", str(gbps))
                    f = j["forms"]
                    ms = {n: (f[n]["time_fwd_s"] + f[n]["time_bwd_s"]) * 1e3 for n in forms}
                    ex = f["explicit"]
                    share = (ex["comm_fwd_s"] + ex["comm_bwd_s"]) / (ex["time_fwd_s"] + ex["time_bwd_s"])
                    best = j["fastest_fitting"]
                    peak = "" if best is None else max(f[best]["peak_fwd_bytes"],
                                                       f[best]["peak_bwd_bytes"]) / 2**30
                    print(f"| {label} | {S // 1024}k | {P} | {lname} | "
                          + " | ".join(f"{ms[n]:.2f}" for n in forms)
                          + f" | {share:.0%} | {best or 'none'}"
                          + (f" ({peak:.2f})" if best else "") + " |")


times() if opts.times else ratios()
