#!/usr/bin/env python3
"""Rewrites a schema-2 tuned store as schema 3: each entry gets its family's template hash.

usage: tuned/restamp.py STORE TEST_TUNE TEMPLATES_DIR

STORE          the store file (e.g. tuned/sm_90a/NVIDIA_H200.json), rewritten in place
TEST_TUNE      the test_tune binary (build/tests/test_tune): `TEST_TUNE --family-hashes DIR`
               prints the template set's hash and each family's (mg_gen_family_hash)
TEMPLATES_DIR  the templates the store was tuned with, e.g. from
               `git archive <commit> templates | tar -x -C /tmp/old` -> /tmp/old/templates

Schema 2 stamped the whole template set's hash in the header only. This refuses unless
that header hash is the set hash of TEMPLATES_DIR (so these are the templates the entries
were tuned with), then inserts `"template_hash": <family hash>` after each entry's
"seq_bucket" line (where mlagen writes it) and sets "schema" to 3. Nothing else changes:
the text is edited line by line, so every measured figure keeps its bytes, and the result
is checked with the json module to equal the input but for those fields.
"""
import json
import os
import re
import subprocess
import sys


def main(store, test_tune, templates):
    hashes = json.loads(subprocess.run([test_tune, "--family-hashes", templates], check=True,
                                       capture_output=True, text=True).stdout)
    with open(store, encoding="utf-8") as f:
        text = f.read()
    old = json.loads(text)
    if old["schema"] != 2:
        sys.exit(f"{store}: schema {old['schema']}, expected 2")
    if old["template_hash"] != hashes["set"]:
        sys.exit(f"{store}: header template_hash {old['template_hash']} is not the set hash of "
                 f"{templates} ({hashes['set']}): not the templates it was tuned with")

    lines = text.split("\n")
    schema_line = '\t"schema":\t2,'
    if lines.count(schema_line) != 1:
        sys.exit(f"{store}: expected one line {schema_line!r}")
    lines[lines.index(schema_line)] = '\t"schema":\t3,'
    bucket = re.compile(r'^\t\t\t"seq_bucket":\t\d+,$')  # an entry's own, in file order
    out, i = [], 0
    for line in lines:
        out.append(line)
        if bucket.match(line):
            family = old["entries"][i]["family"]
            out.append(f'\t\t\t"template_hash":\t"{hashes["families"][family]}",')
            i += 1
    if i != len(old["entries"]):
        sys.exit(f"{store}: found {i} entry seq_bucket lines for {len(old['entries'])} entries")
    new_text = "\n".join(out)

    new = json.loads(new_text)
    for e in new["entries"]:
        assert e.pop("template_hash") == hashes["families"][e["family"]]
    assert new.pop("schema") == 3 and old.pop("schema") == 2
    assert new == old, "the rewrite changed something other than the schema and entry hashes"

    tmp = store + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new_text)
    os.replace(tmp, store)
    changed = [e["family"] for e in old["entries"]]
    print(f"{store}: schema 3, {len(changed)} entries stamped "
          f"({', '.join(sorted(set(changed)))})")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
