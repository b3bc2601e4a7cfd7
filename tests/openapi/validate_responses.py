#!/usr/bin/python3
"""Validates HTTP exchanges recorded by the integration tests against
openapi/openapi.yaml.

The integration harness (tests/integration/harness.c, http()) writes one
JSON file per exchange into $TR_RECORD_DIR when that is set:

    {"method": "POST", "path": "/jobs?priority=5",
     "request_headers": ["Idempotency-Key: abc-123"],
     "request_content_type": "application/json",   (null without a body)
     "request_body": "{...}",    (null without a body or when over 64 KiB)
     "request_body_len": 123,
     "status": 201, "content_type": "application/json",
     "headers": "HTTP/1.1 201 Created\\r\\nLocation: /jobs/3\\r\\n...",
     "body": "{...}\\n"}          (null when the body is not UTF-8)

For each exchange this finds the operation (path template and method) and
checks: the status is one the operation documents; the Content-Type is one
of that response's media types; the body validates against the response's
schema (JSON Schema 2020-12 with $refs into components; a text/event-stream
body is split into frames and each parsed frame validated against the
media type's contentSchema); required response headers are present and
match their schemas; a response without content has an empty body.  An
application/octet-stream body (a download) is recorded as null when it is
not UTF-8, so only its length can be checked, against Content-Length, and
only when it was recorded.  HEAD is checked as the path's GET with an
empty body (the daemon answers HEAD wherever it answers GET).  A
path no route serves must be answered 404 with an Error body, a method the
path does not serve 405 with an Error body and an Allow header naming the
documented methods.  For successful (2xx) exchanges the request is checked
too: its JSON body against the requestBody schema and its query and header
parameters against their schemas, since a request the daemon accepts but
the contract forbids means the two disagree.  A 500 is documented (bugs
happen) but counts as a failure here: no test should provoke one.

Results are counted per operation seen (plus "unrouted" for 404/405
answers to paths or methods the API does not have); operations never
exercised are listed.  Identical exchanges are validated once.

On success the recordings are deleted, so the next run starts clean; on
failure they are moved to DIR/last-failed/ for inspection (replacing the
previous ones).  With --integration EXE and no recordings in DIR, EXE (the
integration test binary) is run first with TR_RECORD_DIR=DIR.

Needs Debian's python3-yaml and python3-jsonschema (>= 4.0, for Draft
2020-12) under /usr/bin/python3.

Usage: validate_responses.py [--spec openapi.yaml] [--keep] [--allow-500]
                             [--integration EXE] DIR
Prints "RESULT: N passed, M failed" (N, M: operations).
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
MAX_REPORTS = 200  # problems printed in full; the rest are counted


def fail_setup(msg):
    print("validate_responses: " + msg)
    print("RESULT: 0 passed, 1 failed")
    sys.exit(1)


try:
    import yaml
    import jsonschema
    from jsonschema import Draft202012Validator, FormatChecker
except ImportError as e:  # pragma: no cover
    fail_setup("%s (install Debian's python3-yaml and python3-jsonschema; run with /usr/bin/python3)" % e)

warnings.filterwarnings("ignore", category=DeprecationWarning)

# ---- formats -----------------------------------------------------------

FORMATS = FormatChecker(formats=())
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
POINTER = re.compile(r"^(/([^~/]|~[01])*)*$")


@FORMATS.checks("date-time")
def _date_time(v):
    return not isinstance(v, str) or bool(RFC3339.match(v))


@FORMATS.checks("int32")
def _int32(v):
    return not isinstance(v, int) or -2**31 <= v < 2**31


@FORMATS.checks("int64")
def _int64(v):
    return not isinstance(v, int) or -2**63 <= v < 2**63


@FORMATS.checks("float")
def _float(v):
    return not isinstance(v, (int, float)) or (math.isfinite(v) and abs(v) <= 3.4028234663852886e38)


@FORMATS.checks("json-pointer")
def _json_pointer(v):
    return not isinstance(v, str) or bool(POINTER.match(v))


# JSON Schema counts 16.0 as an integer; the daemon's parser (jansson) does
# not, and refuses it where an integer is wanted.  Validation here follows
# the daemon: an integer is a JSON number written without fraction or
# exponent.
def _strict_integer(checker, instance):
    return isinstance(instance, int) and not isinstance(instance, bool)


Validator = jsonschema.validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer))


# ---- the spec ----------------------------------------------------------


class Spec:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.doc = yaml.safe_load(f)
        self.resolver = jsonschema.RefResolver(base_uri="", referrer=self.doc)
        self.templates = []  # (segments, template)
        for template in self.doc.get("paths", {}):
            self.templates.append((template.strip("/").split("/") if template != "/" else [], template))
        # Literal segments before parameters: /jobs/latest would beat /jobs/{id}.
        self.templates.sort(key=lambda t: [s.startswith("{") for s in t[0]])

    def deref(self, obj):
        seen = 0
        while isinstance(obj, dict) and "$ref" in obj:
            ref = obj["$ref"]
            if not ref.startswith("#/"):
                raise ValueError("only local $refs are supported: " + ref)
            node = self.doc
            for tok in ref[2:].split("/"):
                node = node[tok.replace("~1", "/").replace("~0", "~")]
            obj, seen = node, seen + 1
            if seen > 32:
                raise ValueError("$ref loop at " + ref)
        return obj

    def match(self, path):
        """(template, {param: value}) or (None, None)."""
        segs = path.strip("/").split("/") if path != "/" else []
        for tsegs, template in self.templates:
            if len(tsegs) != len(segs):
                continue
            params = {}
            for t, s in zip(tsegs, segs):
                if t.startswith("{") and t.endswith("}"):
                    if not s:
                        break
                    params[t[1:-1]] = urllib.parse.unquote(s)
                elif t != s:
                    break
            else:
                return template, params
        return None, None

    def errors(self, schema, instance, prefix=""):
        """Validation errors as "/json/pointer: message" strings (the
        pointer empty for the document itself); [] when valid."""
        v = Validator(schema, resolver=self.resolver, format_checker=FORMATS)
        out = []
        for e in sorted(v.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path]):
            where = prefix + "".join("/" + str(p) for p in e.absolute_path)
            # A oneOf/anyOf failure says little on its own.  With a
            # discriminator, the variant the instance names says why;
            # otherwise the closest branch does.
            if e.validator in ("oneOf", "anyOf"):
                target = self.discriminated(e.schema, e.instance)
                if target is not None:
                    more = self.errors(target, e.instance, where)
                    if more:
                        out.extend(more)
                        continue
            msg = e.message if len(e.message) < 300 else e.message[:300] + "..."
            if e.context:
                best = jsonschema.exceptions.best_match(e.context)
                msg = "matches none of the variants (closest: %s at %s)" % (
                    best.message[:200], where + "".join("/" + str(p) for p in best.relative_path) or "/")
            out.append("%s: %s" % (where, msg))
        return out

    def discriminated(self, schema, instance):
        """The variant a discriminator maps the instance to, or None."""
        d = schema.get("discriminator") if isinstance(schema, dict) else None
        if not d or not isinstance(instance, dict):
            return None
        value = instance.get(d.get("propertyName"))
        ref = (d.get("mapping") or {}).get(value) if isinstance(value, str) else None
        return {"$ref": ref} if ref else None


def media_type(ct):
    return (ct or "").split(";")[0].strip().lower()


def parse_headers(raw):
    """The last response's headers (curl collects those of every response,
    e.g. after a 100 Continue) as {lower-case name: value}."""
    blocks, cur = [], None
    for line in (raw or "").split("\n"):
        line = line.rstrip("\r")
        if line.startswith("HTTP/"):
            cur = {}
            blocks.append(cur)
        elif cur is not None and ":" in line:
            name, value = line.split(":", 1)
            cur[name.strip().lower()] = value.strip()
    return blocks[-1] if blocks else {}


def sse_frames(body):
    """Complete frames of an event stream as (fields, problems)."""
    frames, problems = [], []
    text = body.replace("\r\n", "\n").replace("\r", "\n")
    chunks = text.split("\n\n")
    # The last chunk has no blank line after it: an unfinished frame (a
    # stream cut by the client's timeout) or nothing.
    for chunk in chunks[:-1]:
        fields = {"data": []}
        for line in chunk.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                fields["data"].append(value)
            elif name in ("id", "event", "retry"):
                fields[name] = value
            else:
                problems.append("unknown SSE field %r" % name)
        if fields["data"] or "id" in fields or "event" in fields:
            frames.append(fields)
    return frames, problems


def coerce_param(value, schema, spec):
    """A query string value as the JSON type its schema wants, or the string
    itself when it does not convert (validation then reports it)."""
    schema = spec.deref(schema)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    try:
        if t == "integer" and re.fullmatch(r"-?[0-9]+", value):
            return int(value)
        if t == "number":
            return float(value)
        if t == "boolean" and value in ("true", "false"):
            return value == "true"
        if t == "array":
            return [coerce_param(v, schema.get("items", {}), spec) for v in value.split(",")]
    except ValueError:
        pass
    return value


# ---- one exchange -------------------------------------------------------


def check_error_body(spec, rec, problems):
    if media_type(rec.get("content_type")) != "application/json":
        problems.append("Content-Type %r, want application/json" % rec.get("content_type"))
        return
    try:
        body = json.loads(rec.get("body") or "")
    except ValueError as e:
        problems.append("body is not JSON: %s" % e)
        return
    problems.extend("body" + p for p in spec.errors({"$ref": "#/components/schemas/Error"}, body))


def check_unrouted(spec, rec, template, problems):
    """A path without route (404) or a method the path lacks (405)."""
    status = rec["status"]
    if template is None:
        if status != 404:
            problems.append("no documented path matches; want 404, got %d" % status)
        check_error_body(spec, rec, problems)
        return
    allowed = sorted(m.upper() for m in spec.doc["paths"][template] if m in METHODS)
    if status != 405:
        problems.append("%s is not documented on %s (documented: %s); want 405, got %d"
                        % (rec["method"], template, ", ".join(allowed), status))
    else:
        allow = parse_headers(rec.get("headers")).get("allow")
        if allow is None:
            problems.append("405 without an Allow header")
        elif sorted(a.strip() for a in allow.split(",") if a.strip()) != allowed:
            problems.append("Allow: %s, but the documented methods are %s" % (allow, ", ".join(allowed)))
    check_error_body(spec, rec, problems)


def check_request(spec, op, path_item, rec, params, query, problems):
    """A 2xx exchange: the request must be one the contract allows."""
    declared = {}
    for p in list(path_item.get("parameters", [])) + list(op.get("parameters", [])):
        p = spec.deref(p)
        declared[(p["in"], p["name"].lower() if p["in"] == "header" else p["name"])] = p
    for name, value in params.items():
        p = declared.get(("path", name))
        if p is None:
            problems.append("request: path parameter {%s} is not declared" % name)
            continue
        for e in spec.errors(p.get("schema", {}), coerce_param(value, p.get("schema", {}), spec)):
            problems.append("request: path parameter %s=%r%s" % (name, value, e))
    for name, values in query.items():
        p = declared.get(("query", name))
        if p is None:
            problems.append("request: query parameter %r was accepted but is not documented" % name)
            continue
        for value in values:
            for e in spec.errors(p.get("schema", {}), coerce_param(value, p.get("schema", {}), spec)):
                problems.append("request: query parameter %s=%r%s" % (name, value, e))
    for h in rec.get("request_headers") or []:
        name, _, value = h.partition(":")
        p = declared.get(("header", name.strip().lower()))
        if p is not None:
            for e in spec.errors(p.get("schema", {}), value.strip()):
                problems.append("request: header %s%s" % (name.strip(), e))
    rb = spec.deref(op.get("requestBody")) if op.get("requestBody") else None
    body = rec.get("request_body")
    if rb is None:
        return
    if body is None:
        if rb.get("required") and not rec.get("request_body_len"):
            problems.append("request: a required body was missing, yet the request succeeded")
        return
    content = rb.get("content", {})
    mt = media_type(rec.get("request_content_type"))
    if mt not in content and "*/*" not in content:  # "*/*": any type (an upload)
        problems.append("request: Content-Type %r is not one of %s" % (mt, ", ".join(content)))
        return
    if mt == "application/json":
        try:
            doc = json.loads(body)
        except ValueError as e:
            problems.append("request: the body is not JSON (%s), yet the request succeeded" % e)
            return
        for e in spec.errors(content[mt].get("schema", {}), doc):
            problems.append("request body" + e)


def check_response_body(spec, media, rec, problems):
    mt = media_type(rec.get("content_type"))
    body = rec.get("body")
    if mt == "application/octet-stream":
        # Binary: the harness keeps the bytes only when they happen to be
        # UTF-8.  Whatever was kept must be the whole body.
        length = parse_headers(rec.get("headers")).get("content-length")
        if body is not None and length is not None and length.isdigit() and \
                len(body.encode("utf-8")) != int(length):
            problems.append("the body is %d bytes, Content-Length says %s"
                            % (len(body.encode("utf-8")), length))
        return
    if body is None:
        problems.append("the body is not valid UTF-8")
        return
    schema = media.get("schema", {})
    if mt == "application/json":
        try:
            doc = json.loads(body)
        except ValueError as e:
            problems.append("body is not JSON: %s" % e)
            return
        problems.extend("body" + p for p in spec.errors(schema, doc))
    elif mt == "text/event-stream":
        frames, more = sse_frames(body)
        problems.extend(more)
        item = spec.deref(schema).get("contentSchema")
        for i, f in enumerate(frames):
            if "id" not in f or "event" not in f or not f["data"]:
                problems.append("frame %d: needs id, event and data lines, has %s" % (i, sorted(f)))
                continue
            try:
                frame = {"id": int(f["id"]), "event": f["event"], "data": json.loads("\n".join(f["data"]))}
            except ValueError as e:
                problems.append("frame %d (id %s): %s" % (i, f.get("id"), e))
                continue
            if item is not None:
                problems.extend("frame %d (id %s, %s)%s" % (i, f["id"], f["event"], p)
                                for p in spec.errors(item, frame))
    elif mt in ("application/yaml", "application/x-yaml"):
        try:
            doc = yaml.safe_load(body)
        except yaml.YAMLError as e:
            problems.append("body is not YAML: %s" % str(e)[:200])
            return
        if not isinstance(doc, dict) or "openapi" not in doc:
            problems.append("the YAML body is not an OpenAPI document")
    else:
        problems.extend("body" + p for p in spec.errors(schema, body))


def check_exchange(spec, rec, allow_500):
    """(operation label, [problems])."""
    problems = []
    for k in ("method", "path", "status"):
        if k not in rec:
            return "malformed recordings", ["recording has no %r" % k]
    url = urllib.parse.urlsplit(rec["path"])
    template, params = spec.match(url.path)
    method = rec["method"].lower()
    head = (method == "head" and template is not None and "head" not in spec.doc["paths"][template]
            and "get" in spec.doc["paths"][template])
    if head:
        method = "get"
    if template is None or method not in spec.doc["paths"][template]:
        check_unrouted(spec, rec, template, problems)
        return "unrouted", problems
    label = "%s %s" % ("HEAD" if head else method.upper(), template)
    path_item = spec.doc["paths"][template]
    op = path_item[method]
    status = rec["status"]
    responses = op.get("responses", {})
    resp = responses.get(str(status)) or responses.get("%dXX" % (status // 100)) or responses.get("default")
    if resp is None:
        problems.append("status %d is not documented (documented: %s)" % (status, ", ".join(sorted(responses))))
        if status >= 400:
            check_error_body(spec, rec, problems)
        return label, problems
    if status >= 500 and status != 501 and status != 503 and not allow_500:
        problems.append("status %d: documented, but no test should provoke it (a daemon bug?)" % status)
    resp = spec.deref(resp)
    content = resp.get("content")
    if content:
        mt = media_type(rec.get("content_type"))
        if mt not in content:
            problems.append("Content-Type %r is not one of %s" % (rec.get("content_type"), ", ".join(content)))
        elif head:
            if rec.get("body") != "":
                problems.append("HEAD answered with a body")
        else:
            check_response_body(spec, content[mt], rec, problems)
    elif rec.get("body"):
        problems.append("status %d has no documented content, but the body is %r" % (status, rec["body"][:100]))
    headers = parse_headers(rec.get("headers"))
    for name, h in (resp.get("headers") or {}).items():
        h = spec.deref(h)
        value = headers.get(name.lower())
        if value is None:
            if h.get("required"):
                problems.append("header %s is required but missing" % name)
            continue
        for e in spec.errors(h.get("schema", {}), value):
            problems.append("header %s %r%s" % (name, value, e))
    if 200 <= status < 300:
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        check_request(spec, op, path_item, rec, params, query, problems)
    return label, problems


# ---- main --------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the recordings ($TR_RECORD_DIR of the integration tests)")
    ap.add_argument("--spec", default=os.path.join(ROOT, "openapi", "openapi.yaml"))
    ap.add_argument("--keep", action="store_true", help="leave the recordings where they are")
    ap.add_argument("--allow-500", action="store_true", help="accept documented 500 answers")
    ap.add_argument("--integration", metavar="EXE",
                    help="when DIR has no recordings, run this integration test binary first")
    args = ap.parse_args()

    try:
        spec = Spec(args.spec)
    except (OSError, yaml.YAMLError) as e:
        fail_setup("cannot read %s: %s" % (args.spec, e))
    files = sorted(glob.glob(os.path.join(args.dir, "*.json")))
    if not files and args.integration:
        os.makedirs(args.dir, exist_ok=True)
        env = dict(os.environ, TR_RECORD_DIR=os.path.abspath(args.dir))
        print("validate_responses: no recordings in %s; running %s to make them" % (args.dir, args.integration),
              flush=True)
        p = subprocess.run([args.integration], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace")
        if p.returncode != 0:
            # Only the tail, and without Criterion's "Synthesis:" line, which
            # tests/run_tests.py would otherwise take for this test's count.
            tail = [l for l in p.stdout.splitlines() if "Synthesis:" not in l][-15:]
            print("\n".join("  | " + l for l in tail))
            print("validate_responses: %s exited with %d (its own test reports that; validating what it "
                  "recorded)" % (args.integration, p.returncode))
        files = sorted(glob.glob(os.path.join(args.dir, "*.json")))
    if not files:
        fail_setup("no recordings (*.json) in %s: run the integration tests with TR_RECORD_DIR=%s first, "
                   "or pass --integration" % (args.dir, os.path.abspath(args.dir)))

    ops = {}      # label -> [exchanges, failed exchanges]
    reports = []
    seen = set()
    unique = 0
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError) as e:
            label, problems = "malformed recordings", ["%s: %s" % (os.path.basename(path), e)]
        else:
            key = json.dumps([rec.get(k) for k in ("method", "path", "status", "content_type", "body",
                                                   "request_body", "request_headers")], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            unique += 1
            label, problems = check_exchange(spec, rec, args.allow_500)
        counts = ops.setdefault(label, [0, 0])
        counts[0] += 1
        if problems:
            counts[1] += 1
            if len(reports) < MAX_REPORTS:
                reports.append("%s: %s %s -> %s\n    %s" % (
                    os.path.basename(path), rec.get("method"), rec.get("path"), rec.get("status"),
                    "\n    ".join(problems[:20])))

    passed = sum(1 for c in ops.values() if c[1] == 0)
    failed = len(ops) - passed
    for r in reports:
        print("FAIL " + r)
    nfail = sum(c[1] for c in ops.values())
    if nfail > len(reports):
        print("... and %d more failing exchanges" % (nfail - len(reports)))
    print("validate_responses: %d recordings, %d distinct exchanges" % (len(files), unique))
    for label in sorted(ops):
        n, bad = ops[label]
        print("  %-4s %-34s %5d exchanges%s" % ("ok" if not bad else "FAIL", label, n,
                                                 ", %d failed" % bad if bad else ""))
    documented = ["%s %s" % (m.upper(), p) for p, item in spec.doc["paths"].items() for m in item if m in METHODS]
    unseen = [o for o in documented if o not in ops]
    if unseen:
        print("validate_responses: not exercised by the integration tests: " + ", ".join(unseen))

    if not args.keep:
        dest = os.path.join(args.dir, "last-failed")
        shutil.rmtree(dest, ignore_errors=True)
        if failed:
            os.makedirs(dest)
        for path in files:
            try:
                if failed:
                    shutil.move(path, dest)
                else:
                    os.remove(path)
            except OSError:
                pass
        if failed:
            print("validate_responses: recordings moved to %s" % dest)
    print("RESULT: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
