#!/usr/bin/env python3
"""Keeps the API's route table and openapi/openapi.yaml in sync.

Reads the `routes[]` table of api/routes.c ({"METHOD", "/path", handler,
flags}) and the paths and methods of the OpenAPI document, and fails naming
every route that is on one side only.  It also checks two flags against the
document: a TR_ROUTE_PUBLIC route must say `security: []` (no token), and a
TR_ROUTE_JSON_BODY or TR_ROUTE_UPLOAD route must have a requestBody (and
the other way round).
The role column (TR_ROLE_READ, _WRITE, _ADMIN) of every route that is not
public must match the operation's `x-required-role` (read, write, admin).
The job states of core/job.c (tr_job_state_names, the names the store
keeps and the API shows) must be the JobState schema's enum, in order.

Python standard library only: the YAML is read line by line, which works
because the paths section is regular (two-space indents, a path per
`  /...:` line, a method per `    get:` line).

Usage: routes_sync.py [routes.c [openapi.yaml]]
Prints "RESULT: 1 passed, 0 failed" or "RESULT: 0 passed, 1 failed".
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def brace_groups(text):
    """The contents of each top-level {...} in text; braces inside string
    literals ("/jobs/{id}") do not count."""
    groups, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            if depth == 0:
                start = i + 1
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                groups.append(text[start:i])
        i += 1
    return groups


def split_fields(entry):
    """Splits at commas outside string literals."""
    fields, cur, in_str = [], "", False
    for c in entry:
        if c == '"':
            in_str = not in_str
        if c == "," and not in_str:
            fields.append(cur)
            cur = ""
        else:
            cur += c
    return fields + [cur]


def read_routes(path):
    """{(METHOD, path): set(flags)} from the C table, plus problems."""
    text = strip_c_comments(open(path, encoding="utf-8").read())
    m = re.search(r"\btr_api_route\s+routes\s*\[\s*\]\s*=\s*\{(.*?)\n\s*\}\s*;", text, re.S)
    if not m:
        return None, ["%s: no `struct tr_api_route routes[] = {...};` table found" % path]
    routes, problems = {}, []
    for entry in brace_groups(m.group(1)):
        fields = [f.strip() for f in split_fields(entry)]
        if len(fields) < 3 or not re.fullmatch(r'"[^"]*"', fields[0]) or not re.fullmatch(r'"[^"]*"', fields[1]):
            problems.append("%s: cannot read route entry {%s}" % (path, entry.strip()))
            continue
        method, pattern = fields[0].strip('"'), fields[1].strip('"')
        flags = set()
        if len(fields) > 3:
            flags = {f.strip() for f in fields[3].split("|")} - {"0", ""}
        if len(fields) > 4 and fields[4].startswith("TR_ROLE_"):
            flags.add("role:" + fields[4][len("TR_ROLE_"):].lower())
        key = (method.upper(), pattern)
        if key in routes:
            problems.append("%s: %s %s is in the table twice" % (path, *key))
        routes[key] = flags
    if not routes:
        problems.append("%s: the route table is empty" % path)
    return routes, problems


def unquote(s):
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def read_openapi(path):
    """{(METHOD, path): {"public": bool, "body": bool}} from the document."""
    ops, problems = {}, []
    in_paths = False
    cur_path = cur_op = None
    for n, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = raw.rstrip("\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            in_paths = line.rstrip() == "paths:"
            cur_path = cur_op = None
            continue
        if not in_paths:
            continue
        text = line.strip()
        if indent == 2:
            if not text.endswith(":"):
                problems.append("%s:%d: cannot read path line %r" % (path, n, text))
                continue
            cur_path, cur_op = unquote(text[:-1]), None
            if not cur_path.startswith("/"):
                problems.append("%s:%d: path %r does not start with /" % (path, n, cur_path))
        elif indent == 4 and cur_path:
            key = text.split(":", 1)[0].strip()
            cur_op = None
            if key in METHODS:
                cur_op = (key.upper(), cur_path)
                if cur_op in ops:
                    problems.append("%s:%d: %s %s is defined twice" % (path, n, *cur_op))
                ops[cur_op] = {"public": False, "body": False, "role": None}
        elif indent == 6 and cur_op:
            if re.match(r"security:\s*\[\s*\]\s*$", text):
                ops[cur_op]["public"] = True
            elif text.startswith("requestBody:"):
                ops[cur_op]["body"] = True
            elif text.startswith("x-required-role:"):
                ops[cur_op]["role"] = unquote(text.split(":", 1)[1])
    if not ops:
        problems.append("%s: no operations found under paths:" % path)
    return ops, problems


def read_job_states(path):
    """The names of tr_job_state_names in core/job.c, in enum order."""
    text = strip_c_comments(open(path, encoding="utf-8").read())
    m = re.search(r"tr_job_state_names\[[^]]*\]\s*=\s*\{(.*?)\};", text, re.S)
    return re.findall(r'\[TR_JOB_[A-Z_]+\]\s*=\s*"([a-z_]+)"', m.group(1)) if m else []


def read_openapi_states(path):
    """The enum of components.schemas.JobState (a one-line `enum: [...]`)."""
    in_schema = False
    for line in open(path, encoding="utf-8"):
        if line.rstrip() == "    JobState:":
            in_schema = True
        elif in_schema and not line.startswith("      "):
            break
        elif in_schema:
            m = re.match(r"\s+enum:\s*\[(.*)\]\s*$", line)
            if m:
                return [v.strip() for v in m.group(1).split(",")]
    return []


def main(argv):
    routes_c = argv[1] if len(argv) > 1 else os.path.join(ROOT, "api", "routes.c")
    spec = argv[2] if len(argv) > 2 else os.path.join(ROOT, "openapi", "openapi.yaml")
    routes, problems = read_routes(routes_c)
    ops, more = read_openapi(spec)
    problems += more
    job_c = os.path.join(ROOT, "core", "job.c")
    states, doc_states = read_job_states(job_c), read_openapi_states(spec)
    if not states:
        problems.append("%s: cannot read tr_job_state_names" % job_c)
    elif states != doc_states:
        problems.append("the job states of core/job.c are [%s], openapi.yaml's JobState enum [%s]"
                        % (", ".join(states), ", ".join(doc_states)))
    if routes is not None:
        for key in sorted(set(routes) - set(ops), key=lambda k: (k[1], k[0])):
            problems.append("%s %s is in api/routes.c but not in openapi.yaml" % key)
        for key in sorted(set(ops) - set(routes), key=lambda k: (k[1], k[0])):
            problems.append("%s %s is in openapi.yaml but not in api/routes.c" % key)
        for key in sorted(set(ops) & set(routes), key=lambda k: (k[1], k[0])):
            public = "TR_ROUTE_PUBLIC" in routes[key]
            body = "TR_ROUTE_JSON_BODY" in routes[key] or "TR_ROUTE_UPLOAD" in routes[key]
            if public != ops[key]["public"]:
                problems.append("%s %s: %s" % (key + ((
                    "TR_ROUTE_PUBLIC in the table but openapi.yaml does not say `security: []`" if public else
                    "openapi.yaml says `security: []` but the table has no TR_ROUTE_PUBLIC"),)))
            role = next((f[5:] for f in routes[key] if f.startswith("role:")), None)
            if not public and role != ops[key]["role"]:
                problems.append("%s %s: the table's role is %s, openapi.yaml's x-required-role %s"
                                % (key + (role, ops[key]["role"])))
            if body != ops[key]["body"]:
                problems.append("%s %s: %s" % (key + ((
                    "TR_ROUTE_JSON_BODY or TR_ROUTE_UPLOAD in the table but openapi.yaml has no requestBody"
                    if body else
                    "openapi.yaml has a requestBody but the table has no TR_ROUTE_JSON_BODY or TR_ROUTE_UPLOAD"),)))
    for p in problems:
        print("routes_sync: " + p)
    if problems:
        print("RESULT: 0 passed, 1 failed")
        return 1
    print("routes_sync: %d routes and %d job states, the same in the code and openapi.yaml"
          % (len(routes), len(states)))
    print("RESULT: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
