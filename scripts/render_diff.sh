#!/usr/bin/env bash
# render_diff.sh OLD_MLAGEN NEW_MLAGEN: renders every kernel family for the shipped configs
# (every sequence-parallel degree that divides the heads up to 8, bf16 and fp16, default
# configurations) and for every entry of the tuned stores (its model, its configuration set
# with --set family.k=v), with both binaries, and diffs the kernel sources and the device
# header byte for byte (manifest.json is left out: its fields may change). Exit 0 when every
# rendered source is identical, 1 otherwise. For changes to the templates' kernel{} blocks
# or the generator that must not change any rendered kernel.
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2")
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
runs=0; bad=0
render() { # name, then mlagen generate arguments
  local name=$1; shift
  "$old" generate --out "$work/old/$name" "$@" >/dev/null
  "$new" generate --out "$work/new/$name" "$@" >/dev/null
  if ! diff -r -q -x manifest.json "$work/old/$name" "$work/new/$name"; then
    echo "render_diff: $name differs ($*)"; bad=1
  fi
  runs=$((runs + 1))
}
for cfg in "$root"/configs/*.json; do
  m=$(basename "$cfg" .json)
  H=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_attention_heads'])" "$cfg")
  for sp in 1 2 4 8; do
    [ $((H % sp)) -eq 0 ] || continue
    for t in bf16 fp16; do render "$m-sp$sp-$t" --model "$cfg" --sp "$sp" --dtype "$t"; done
  done
done
# every tuned entry: its shape's model and sp, its configuration
python3 - "$root" > "$work/entries" <<'PY'
import glob, json, os, sys
root = sys.argv[1]
models = {}
for c in glob.glob(os.path.join(root, "configs", "*.json")):
    j = json.load(open(c))
    key = (j["qk_nope_head_dim"], j["qk_rope_head_dim"], j["v_head_dim"], j["kv_lora_rank"])
    models.setdefault(key, []).append((c, j["num_attention_heads"]))
for f in sorted(glob.glob(os.path.join(root, "tuned", "*", "*.json"))):
    for i, e in enumerate(json.load(open(f))["entries"]):
        s = e["shape"]
        for c, H in models.get((s["d_n"], s["d_r"], s["d_v"], s["d_c"]), []):
            sps = [p for p in (1, 2, 4, 8) if H % p == 0 and (H // p == s["heads"] or p == 1)]
            for p in sps:
                # the settings the plans fix (k_packed, deterministic, qsplit) are refused by
                # --set (mg_spec_override_check): generate renders them as the plans do
                sets = " ".join("--set %s.%s=%d" % (e["family"], k, v) for k, v in sorted(e["config"].items())
                                if k not in ("k_packed", "deterministic", "qsplit"))
                print("%s-%d-%s-sp%d %s --sp %d --dtype %s %s" % (os.path.basename(f), i, os.path.basename(c), p, c, p, s["dtype"], sets))
PY
while read -r name cfg rest; do
  # shellcheck disable=SC2086
  render "$name" --model "$cfg" $rest
done < "$work/entries"
n=$(find "$work/new" -name '*.cu' | wc -l)
echo "render_diff: $runs generations, $n kernel files compared: $([ $bad = 0 ] && echo identical || echo DIFFERENT)"
exit $bad
