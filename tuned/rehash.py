#!/usr/bin/env python3
"""Moves tuned entries onto new family template hashes when the change compiles to the same code.

usage: tuned/rehash.py STORE OLD_BUILD OLD_TEMPLATES NEW_BUILD NEW_TEMPLATES

STORE          a schema-3 store (e.g. tuned/sm_90a/NVIDIA_H200.json), rewritten in place
OLD_BUILD      a build tree of the commit whose templates are OLD_TEMPLATES (its mlagen and
               tests/test_tune: `test_tune --family-hashes DIR` prints each family's hash as
               that commit's generator computes it)
OLD_TEMPLATES  that commit's templates, e.g. a worktree's templates/ or
               `git archive <commit> templates | tar -x -C /tmp/old` -> /tmp/old/templates
NEW_BUILD      the build tree of the tree whose templates are NEW_TEMPLATES
NEW_TEMPLATES  the templates the entries move to (the working tree's templates/)

A template change voids its family's entries (docs/tuning.md), which is right when the kernel
changed but wasteful when the change only moved code (into the device library, a kernel{}
field) and the GPU runs the same instructions. For each entry still stamped with its family's
OLD hash, this renders the entry's kernel (its model, SP degree, dtype, causal and tuned
configuration) with both binaries and compares:
  1. the rendered source with its headers, byte for byte: equal -> moved ("source");
  2. else the SASS: both compiled by `nvcc -cubin -arch=<the store's arch>` and disassembled by
     nvdisasm (the toolkit's, or $NVDISASM), comments, addresses and the kernel's symbol
     normalized away: equal instruction streams -> moved ("sass");
  3. else equivalent code -> moved ("sass-equivalent"): the same launch (block, dynamic
     shared memory: the manifests' launch rules equal) and the same multiset of every
     instruction that moves data or does the kernel's arithmetic work (tensor-core MMAs,
     shared and global loads and stores with their offsets, cp.async, atomics and reductions,
     MUFU, shuffles, barriers), compared with register numbers erased but every immediate
     and address offset kept; the whole instruction count within 1% and the registers per
     thread within 3 (ptxas -v). What may differ is scheduling, register allocation and
     the integer compares and address arithmetic around the same work. This is static: a
     change of a loop's trip count that keeps the loop body would pass, so the rule is for
     refactors that are meant to change nothing, reviewed as such;
  4. else the entry keeps its old hash (plans report "template changed" until it is swept again).
Only the template_hash lines of moved entries change; every measured figure keeps its bytes,
which the json module checks. Prints one line per entry.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def family_hashes(test_tune, templates):
    out = subprocess.run([test_tune, "--family-hashes", templates], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["families"]


def model_for(shape):
    """(config path, sp) whose kernels see shape's heads and dims, or None."""
    for c in sorted(glob.glob(os.path.join(ROOT, "configs", "*.json"))):
        j = json.load(open(c))
        dims = (j["qk_nope_head_dim"], j["qk_rope_head_dim"], j["v_head_dim"], j["kv_lora_rank"])
        if dims != (shape["d_n"], shape["d_r"], shape["d_v"], shape["d_c"]):
            continue
        H = j["num_attention_heads"]
        if H % shape["heads"] == 0:
            return c, H // shape["heads"]
    return None


def render(mlagen, out, cfg, sp, entry):
    sets = []
    for k, v in sorted(entry["config"].items()):
        sets += ["--set", "%s.%s=%d" % (entry["family"], k, v)]
    dtype = {"bf16": "bf16", "f16": "fp16", "fp16": "fp16"}[entry["shape"]["dtype"]]
    subprocess.run([mlagen, "generate", "--model", cfg, "--sp", str(sp), "--dtype", dtype,
                    "--out", out] + sets, check=True, capture_output=True)
    man = json.load(open(os.path.join(out, "manifest.json")))
    hits = [k for k in man["kernels"] if k["family"] == entry["family"]
            and k["spec"]["causal"] == entry["shape"]["causal"]
            and k["spec"]["heads"] == entry["shape"]["heads"]
            and all(k["config"].get(t) == v for t, v in entry["config"].items())]
    if len(hits) != 1:
        raise RuntimeError("%d kernels of %s match the entry in %s" % (len(hits), entry["family"], out))
    return hits[0]["file"], man["headers"], hits[0]["launch"]


def nvdisasm():
    cand = [os.environ.get("NVDISASM", ""), shutil.which("nvdisasm") or "",
            "/usr/local/cuda/bin/nvdisasm"]
    cand += glob.glob(os.path.join(ROOT, "build", "tools", "nvidia", "*", "bin", "nvdisasm"))
    for c in cand:
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("rehash.py: no nvdisasm (set NVDISASM, or run scripts/setup.sh, which installs one)")


# Opcode prefixes of the instructions whose counts must match for "sass-equivalent".
WORK_OPS = ("HMMA", "HGMMA", "IMMA", "LDSM", "STSM", "LDS", "STS", "LDG", "STG", "LDGSTS",
            "UTMALDG", "UTMASTG", "RED", "ATOM", "ATOMS", "MUFU", "SHFL", "BAR", "DEPBAR",
            "SYNCS", "WARPGROUP")


def sass(src_dir, file, arch, tmp):
    """(normalized instruction lines, registers per thread) of file compiled for arch."""
    cubin = os.path.join(tmp, file + ".cubin")
    r = subprocess.run(["nvcc", "-cubin", "-arch=" + arch, "-Xptxas", "-v", "-I", src_dir, "-o",
                        cubin, os.path.join(src_dir, file)], check=True, capture_output=True,
                       text=True)
    regs = re.search(r"Used (\d+) registers", r.stdout + r.stderr)
    text = subprocess.run([nvdisasm(), "-c", cubin], check=True, capture_output=True,
                          text=True).stdout
    lines = []
    for line in text.splitlines():
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)      # instruction addresses
        line = re.sub(r"/\*.*?\*/", "", line).strip()        # encodings and comments
        line = re.sub(r"mla_\w+", "KERNEL", line)            # the kernel's symbol
        line = line.strip("{} ;")
        if line and not line.startswith(".") and not line.endswith(":"):
            lines.append(line)
    return lines, int(regs.group(1)) if regs else -1


def opcode(line):
    words = line.split()
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def equivalent(a, b):
    """Whether two (lines, registers) compile results do the same work (rule 3 above)."""
    (la, ra), (lb, rb) = a, b
    if abs(ra - rb) > 3 or abs(len(la) - len(lb)) > 0.01 * max(len(la), 1):
        return False
    erase = lambda l: re.sub(r"\b(U?R|U?P)\d+\b", r"\1", l)  # register numbers only
    work = lambda ls: sorted(erase(l) for l in ls if opcode(l).split(".")[0] in WORK_OPS)
    return work(la) == work(lb)


def main(store, old_build, old_tpl, new_build, new_tpl):
    tt = lambda b: os.path.join(b, "tests", "test_tune")
    old_bin, new_bin = os.path.join(old_build, "mlagen"), os.path.join(new_build, "mlagen")
    old_h, new_h = family_hashes(tt(old_build), old_tpl), family_hashes(tt(new_build), new_tpl)
    text = open(store, encoding="utf-8").read()
    data = json.loads(text)
    if data["schema"] != 3:
        sys.exit("%s: schema %s, expected 3" % (store, data["schema"]))
    moved = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, e in enumerate(data["entries"]):
            f, h = e["family"], e["template_hash"]
            tag = "%d %s h%d bucket %d" % (i, f, e["shape"]["heads"], e["seq_bucket"])
            if h == new_h.get(f):
                print("%s: already on the new hash" % tag)
                continue
            if h != old_h.get(f):
                print("%s: stamped with neither hash (stale before this change): kept" % tag)
                continue
            m = model_for(e["shape"])
            if not m:
                print("%s: no shipped model has this shape: kept" % tag)
                continue
            od, nd = os.path.join(tmp, "old%d" % i), os.path.join(tmp, "new%d" % i)
            of, ohs, olaunch = render(old_bin, od, m[0], m[1], e)
            nf, nhs, nlaunch = render(new_bin, nd, m[0], m[1], e)
            same = lambda a, b: open(a, "rb").read() == open(b, "rb").read()
            if of == nf and ohs == nhs and same(os.path.join(od, of), os.path.join(nd, nf)) and \
                    all(same(os.path.join(od, x), os.path.join(nd, x)) for x in ohs):
                moved[i] = "source identical"
            else:
                so, sn = sass(od, of, data["arch"], tmp), sass(nd, nf, data["arch"], tmp)
                if so[0] == sn[0]:
                    moved[i] = "SASS identical"
                elif olaunch == nlaunch and equivalent(so, sn):
                    moved[i] = "sass-equivalent: %d -> %d instructions, %d -> %d registers" % (
                        len(so[0]), len(sn[0]), so[1], sn[1])
            if i not in moved:
                print("%s: the compiled code differs: kept (sweep it again)" % tag)
                continue
            print("%s: moved (%s)" % (tag, moved[i]))
    if not moved:
        return
    lines, out, i = text.split("\n"), [], 0
    pat = re.compile(r'^(\t\t\t"template_hash":\t")([0-9a-f]{64})(",)$')
    for line in lines:
        mt = pat.match(line)
        if mt:
            if i in moved:
                line = mt.group(1) + new_h[data["entries"][i]["family"]] + mt.group(3)
            i += 1
        out.append(line)
    if i != len(data["entries"]):
        sys.exit("%s: found %d entry template_hash lines for %d entries" % (store, i, len(data["entries"])))
    new_text = "\n".join(out)
    new = json.loads(new_text)
    for k, e in enumerate(new["entries"]):
        if k in moved:
            e["template_hash"] = data["entries"][k]["template_hash"]
    assert new == data, "the rewrite changed something other than the moved entries' hashes"
    tmpf = store + ".tmp"
    with open(tmpf, "w", encoding="utf-8") as fh:
        fh.write(new_text)
    os.replace(tmpf, store)
    print("%s: %d of %d entries moved to their families' new hashes" % (store, len(moved), len(data["entries"])))


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
