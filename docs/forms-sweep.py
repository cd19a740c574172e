#!/usr/bin/env python3
"""Prints docs/forms.md's sweep table: each form's figures relative to explicit for
DeepSeek-V3 over S and P, from `mlagen plan --json`.

usage: docs/forms-sweep.py [path/to/mlagen]   (default build/mlagen)
"""
import json
import subprocess
import sys

mlagen = sys.argv[1] if len(sys.argv) > 1 else "build/mlagen"
forms = ["explicit", "absorbed", "laga", "laga-r", "laga-f"]
print("| S | P | explicit sent fwd+bwd (MiB) | explicit saved (MiB) | "
      + " | ".join(f"{f} sent / saved / peak bwd" for f in forms[1:]) + " |")
print("|---|---|---|---|" + "---|" * (len(forms) - 1))
for S in (4096, 8192, 16384):
    for P in (4, 8, 16):
        out = subprocess.run([mlagen, "plan", "--model", "deepseek-v3", "--seq", str(S),
                              "--sp", str(P), "--json"], check=True, capture_output=True,
                             text=True).stdout
        f = json.loads(out)["forms"]
        ex = f["explicit"]
        sent = lambda x: x["sent_fwd_bytes"] + x["sent_bwd_bytes"]
        cells = []
        for name in forms[1:]:
            x = f[name]
            cells.append(f"{sent(x) / sent(ex):.2f} / {x['saved_bytes'] / ex['saved_bytes']:.2f}"
                         f" / {x['peak_bwd_bytes'] / ex['peak_bwd_bytes']:.2f}")
        print(f"| {S} | {P} | {sent(ex) / 2**20:.1f} | {ex['saved_bytes'] / 2**20:.1f} | "
              + " | ".join(cells) + " |")
