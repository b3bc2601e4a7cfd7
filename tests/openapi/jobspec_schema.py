#!/usr/bin/python3
"""Checks the JobSpec schema of openapi/openapi.yaml against the spec
parser's own tests, so the two cannot drift apart unnoticed.

engine/spec.c is the truth.  Its unit test (tests/unit/engine/test_spec.c)
holds specs the parser accepts (full_spec, base_spec, round_trip_specs,
every parse_ok(...) call) and a table of one-edit invalid specs it refuses
(the `cases[]` of the spec/invalid test).  This script reads those C
string literals, and checks that the schema accepts every accepted spec
and every file in examples/, and refuses every refused one, except the
few the parser refuses for reasons JSON Schema cannot state (listed in
CROSS_FIELD below with why).

Needs Debian's python3-yaml and python3-jsonschema under /usr/bin/python3.
Usage: jobspec_schema.py [test_spec.c [openapi.yaml]]
Prints "RESULT: N passed, M failed" (N, M: specs checked).
"""
import copy
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import validate_responses as vr  # noqa: E402  (the same schema machinery)

# Edits (pointer, value) of the invalid table that the schema cannot
# refuse, with the parser's reason.  An edit listed here that the schema
# does refuse is fine (only reported).
CROSS_FIELD = {
    ("/model/layers/0/units", "5"): "the model's output must have as many values as the synthetic source's classes",
    ("/model/inputs", "[1, 4, 2]"): "a dense layer takes a flat input (shapes flow through the layers)",
    ("/data/train/shape", "[2, 2, 2]"): "a dense layer takes a flat input (the source's shape is the model's)",
    ("/data/train/shape", "[2, 2, 3]"): "features, when given with shape, must be C x H x W",
    ("/model/layers/0", '{"type": "residual", "layers": [{"type": "dense", "units": 3}]}'):
        "a residual block's layers must keep its input's shape",
    ("/model/layers/0", '{"type": "conv2d", "filters": 4, "kernel": 3}'): "conv2d takes an image input",
    ("/model/layers", '[{"type": "relu"}]'): "the model needs a layer with parameters",
    ("/model/inputs", "9"): "inputs must equal the synthetic source's features",
    ("/data/validation", None): "a synthetic validation source must match the train source",
    ("/schedule", '{"type": "cosine", "min_lr": 0.5}'): "min_lr must not exceed optimizer.lr",
    ("/monitors", None): "a metric may be monitored once (uniqueness by key)",
    ("/model/layers/1", '{"type": "dropout", "rate": 0.99999999999}'): "rounds to 1.0 as a float",
    ("/optimizer/lr", "1e-60"): "rounds to 0 as a float",
    ("/data/train", None): "softmax_cross_entropy needs a classification task",
    ("/early_stopping", '{"metric": "val_loss"}'): "val_loss needs validation data",
    ("/data/train", '{"format": "synthetic", "task": "regression", "samples": 10, "features": 65536,'
     ' "outputs": 8192}'): "outputs x features (a product) may be at most 2^28",
    ("/model/layers", '[{"type": "dense", "units": 16777216}, {"type": "dense", "units": 16777216},'
     ' {"type": "dense", "units": 4}]'): "at most 2^36 parameters (a sum of products over the layers)",
    ("/data/transforms", '[{"type": "normalize", "mean": [1, 2], "std": [1]}]'):
        "normalize's mean and std have one value per channel each (equal lengths)",
}


def waits_for_layers(spec, doc):
    """Why an example cannot be checked yet, or None: it uses image layers
    or [C, H, W] inputs that the schema (and the engine) do not have yet.
    Such an example is skipped, visibly, until they land."""
    schemas = spec.doc["components"]["schemas"]
    known = set(schemas["Layer"].get("discriminator", {}).get("mapping", {}))
    model = doc.get("model", {})
    unknown = sorted({layer.get("type") for layer in model.get("layers", []) if layer.get("type") not in known})
    if unknown:
        return "layer types %s are not in the schema yet" % ", ".join(map(str, unknown))
    inputs_schema = spec.deref(schemas["ModelSpec"]["properties"]["inputs"]) if "ModelSpec" in schemas else {}
    if isinstance(model.get("inputs"), list) and inputs_schema.get("type") == "integer":
        return "[C, H, W] model inputs are not in the schema yet"
    return None


def cross_field_reason(edit, value):
    if (edit, value) in CROSS_FIELD:
        return CROSS_FIELD[(edit, value)]
    reason = CROSS_FIELD.get((edit, None))
    if reason is None:
        return None
    # The (edit, None) entries cover only the cross-field variants.
    if edit == "/data/validation" and '"classes": 5' in value:
        return reason
    if edit == "/monitors" and value.count('"grad_norm"') > 1:
        return reason
    if edit == "/data/train" and '"task": "regression"}' in value and '"classes"' not in value:
        return reason
    return None


# ---- reading C string literals ------------------------------------------

TOKEN = re.compile(r'''
    (?P<comment>/\*.*?\*/|//[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<number>[0-9][\w.]*)
  | (?P<space>\s+)
  | (?P<punct>.)
''', re.S | re.X)

ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "r": "\r", "0": "\0"}


def c_unescape(lit):
    body = lit[1:-1]
    return re.sub(r"\\(.)", lambda m: ESCAPES.get(m.group(1), m.group(1)), body)


def tokens(text):
    out = []
    for m in TOKEN.finditer(text):
        kind = m.lastgroup
        if kind in ("comment", "space"):
            continue
        out.append((kind, m.group(kind)))
    return out


def string_macros(toks):
    """#define NAME "..." "..." (string-only macros)."""
    macros = {}
    i = 0
    while i < len(toks):
        if toks[i] == ("punct", "#") and i + 2 < len(toks) and toks[i + 1] == ("ident", "define"):
            name = toks[i + 2][1]
            j, parts = i + 3, []
            while j < len(toks) and toks[j][0] == "string":
                parts.append(c_unescape(toks[j][1]))
                j += 1
            if parts:
                macros[name] = "".join(parts)
            i = j
        else:
            i += 1
    return macros


def concat(toks, i, macros):
    """Adjacent literals and string macros from toks[i]: (text or None, next i)."""
    parts = []
    while i < len(toks):
        kind, val = toks[i]
        if kind == "string":
            parts.append(c_unescape(val))
        elif kind == "ident" and val in macros:
            parts.append(macros[val])
        else:
            break
        i += 1
    return ("".join(parts) if parts else None), i


def find_seq(toks, seq, start=0):
    for i in range(start, len(toks) - len(seq) + 1):
        if all(toks[i + k][1] == s for k, s in enumerate(seq)):
            return i
    return -1


def read_test_spec(path):
    toks = tokens(open(path, encoding="utf-8").read())
    macros = string_macros(toks)
    valid, invalid = {}, []
    for name in ("full_spec", "base_spec"):
        i = find_seq(toks, [name, "="])
        if i < 0:
            raise ValueError("%s: no %s" % (path, name))
        valid[name], _ = concat(toks, i + 2, macros)
    i = find_seq(toks, ["round_trip_specs", "[", "]", "=", "{"])
    if i >= 0:
        i, n = i + 5, 0
        while toks[i][1] != "}":
            text, j = concat(toks, i, macros)
            if text is not None:
                valid["round_trip_specs[%d]" % n] = text
            else:
                j = i + 1  # NULL
            if toks[j][1] == ",":
                j += 1
            i, n = j, n + 1
    i, n = 0, 0
    while True:
        i = find_seq(toks, ["parse_ok", "("], i)
        if i < 0:
            break
        text, _ = concat(toks, i + 2, macros)
        if text is not None:
            valid["parse_ok #%d" % n] = text
            n += 1
        i += 2
    i = find_seq(toks, ["cases", "[", "]", "=", "{"])
    if i < 0:
        raise ValueError("%s: no cases[] table" % path)
    i += 5
    while toks[i][1] == "{":
        fields, j = [], i + 1
        while toks[j][1] != "}":
            text, j = concat(toks, j, macros)
            fields.append(text)
            if toks[j][1] == ",":
                j += 1
        invalid.append(tuple(fields))
        i = j + 1
        if toks[i][1] == ",":
            i += 1
    return valid, invalid


# ---- edits --------------------------------------------------------------


def apply_edit(doc, pointer, value):
    """As apply_edit() in test_spec.c: set (or, for "", delete) at pointer."""
    toks = [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]
    cur = doc
    for t in toks[:-1]:
        cur = cur[int(t)] if isinstance(cur, list) else cur[t]
    last = toks[-1]
    if value == "":
        del cur[last]
    elif isinstance(cur, list):
        i = int(last)
        if i == len(cur):
            cur.append(json.loads(value))
        else:
            cur[i] = json.loads(value)
    else:
        cur[last] = json.loads(value)


def main(argv):
    test_c = argv[1] if len(argv) > 1 else os.path.join(ROOT, "tests", "unit", "engine", "test_spec.c")
    spec = vr.Spec(argv[2] if len(argv) > 2 else os.path.join(ROOT, "openapi", "openapi.yaml"))
    schema = {"$ref": "#/components/schemas/JobSpec"}
    try:
        valid, invalid = read_test_spec(test_c)
    except (OSError, ValueError, IndexError, KeyError) as e:
        print("jobspec_schema: cannot read the spec tests: %s" % e)
        print("RESULT: 0 passed, 1 failed")
        return 1
    skipped = 0
    for f in sorted(glob.glob(os.path.join(ROOT, "examples", "*.json"))):
        text = open(f, encoding="utf-8").read()
        why = waits_for_layers(spec, json.loads(text))
        if why:
            skipped += 1
            print("SKIP %s: %s" % (os.path.relpath(f, ROOT), why))
            continue
        valid[os.path.relpath(f, ROOT)] = text

    passed = failed = 0
    for name, text in valid.items():
        errs = spec.errors(schema, json.loads(text))
        if errs:
            failed += 1
            print("FAIL %s: the parser accepts it, the schema refuses it:\n    %s" % (name, "\n    ".join(errs)))
        else:
            passed += 1
    base = json.loads(valid["base_spec"])
    if spec.errors(schema, base):
        print("jobspec_schema: base_spec does not validate, so the invalid cases mean nothing")
    cross = 0
    for case in invalid:
        edit, value = case[0], case[1]
        doc = copy.deepcopy(base)
        try:
            apply_edit(doc, edit, value)
        except (KeyError, IndexError, ValueError) as e:
            failed += 1
            print("FAIL edit %s = %s: cannot apply (%s)" % (edit, value, e))
            continue
        errs = spec.errors(schema, doc)
        reason = cross_field_reason(edit, value)
        if errs:
            passed += 1
        elif reason:
            passed += 1
            cross += 1
        else:
            failed += 1
            print("FAIL edit %s = %s: the parser refuses it (at %s), the schema accepts it"
                  % (edit, value or "(delete)", case[2]))
    # The parser's array limits (test spec/array_limits).
    for what, edit in (("65 layers", lambda d: d["model"]["layers"].extend([{"type": "relu"}] * 64)),
                       ("33 monitors", lambda d: d.__setitem__("monitors", [{"metric": "grad_norm"}] * 33)),
                       ("17 transforms", lambda d: d["data"].__setitem__(
                           "transforms", [{"type": "standardize"}] * 17))):
        doc = copy.deepcopy(base)
        edit(doc)
        if spec.errors(schema, doc):
            passed += 1
        else:
            failed += 1
            print("FAIL %s: the parser refuses it, the schema accepts it" % what)
    print("jobspec_schema: %d accepted specs, %d refused ones (%d refused only by cross-field checks "
          "the schema describes in words), %d examples waiting for image layers"
          % (len(valid), len(invalid) + 3, cross, skipped))
    print("RESULT: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
