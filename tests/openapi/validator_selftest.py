#!/usr/bin/python3
"""Checks that validate_responses.py catches what it is for: each case is
a crafted exchange and whether the validator must find a problem in it.
Without this, a validator that silently passed everything (a schema
lookup gone wrong) would look exactly like a daemon that keeps the
contract.  Uses the spec's own examples as the good bodies.

Needs Debian's python3-yaml and python3-jsonschema under /usr/bin/python3.
Prints "RESULT: N passed, M failed" (N, M: cases).
"""
import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import validate_responses as vr  # noqa: E402

SPEC = vr.Spec(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "openapi", "openapi.yaml"))
JOB = SPEC.doc["components"]["examples"]["QueuedJob"]["value"]
JSON = "application/json"


def rec(method, path, status, body=None, ctype=JSON, headers=(), req=None, req_headers=()):
    text = body if isinstance(body, str) or body is None else json.dumps(body) + "\n"
    return {"method": method, "path": path, "status": status, "content_type": ctype if text else None,
            "headers": "HTTP/1.1 %d X\r\n" % status + "".join("%s\r\n" % h for h in headers),
            "body": text or "", "request_headers": list(req_headers),
            "request_content_type": JSON if req is not None else None,
            "request_body": json.dumps(req) if req is not None else None,
            "request_body_len": len(json.dumps(req)) if req is not None else 0}


def download(path, body, headers, method="GET"):
    """A download: body None is what the harness records for bytes that
    are not UTF-8."""
    return dict(rec(method, path, 200, body or "x", headers=headers), content_type=OCTETS, body=body)


def err(code):
    return {"error": {"code": code, "message": "m"}}


def job(**changes):
    j = copy.deepcopy(JOB)
    j.update(changes)
    return j


SSE_OK = ('retry: 3000\n\nid: 3\nevent: state\ndata: {"state":"running","error":null}\n\n'
          ': keepalive\n\nid: 4\nevent: log\ndata: {"id":1,"time":"2026-12-01T17:25:34.120Z","level":6,"message":"hi"}\n\n'
          'id: 5\nevent: metrics\ndata: {"points":[{"name":"loss","step":1,"epoch":0,"wall":2.5,"value":null}]}\n\n'
          'id: 6\nevent: sta')  # a frame cut off by the client: ignored
SPEC_BODY = JOB["spec"]
OCTETS = "application/octet-stream"
CKPT = {"step": 200, "epoch": 1, "created_at": "2026-11-29T18:56:41.118Z", "bytes": 1024, "sha256": "0" * 64}
MODEL_HEADERS = ['Content-Disposition: attachment; filename="job-17-step-200-model.safetensors"']

SLURM_PREEMPTION = {"by": "slurm", "priority": 0, "at": "2026-12-05T06:50:01Z", "step": 150, "mode": "checkpoint",
                    "message": "preempted by Slurm: Slurm job 41 was requeued", "slurm_job_id": "41",
                    "restarts": 1, "reason": "BeginTime"}

CASES = [
    # (what, exchange, must find a problem)
    ("healthz ok", rec("GET", "/healthz", 200, {"status": "ok"}), False),
    ("healthz extra field", rec("GET", "/healthz", 200, {"status": "ok", "x": 1}), True),
    ("healthz wrong content type", rec("GET", "/healthz", 200, '{"status":"ok"}', ctype="text/plain"), True),
    ("version undocumented 404", rec("GET", "/version", 404, err("not_found")), True),
    ("unknown path 404", rec("GET", "/nowhere", 404, err("not_found")), False),
    ("unknown path 200", rec("GET", "/nowhere", 200, {"ok": 1}), True),
    ("unknown path non-error body", rec("GET", "/nowhere", 404, {"oops": 1}), True),
    ("405 right Allow", rec("DELETE", "/healthz", 405, err("method_not_allowed"), headers=["Allow: GET"]), False),
    ("405 wrong Allow", rec("DELETE", "/healthz", 405, err("method_not_allowed"), headers=["Allow: GET, PUT"]),
     True),
    ("405 without Allow", rec("DELETE", "/healthz", 405, err("method_not_allowed")), True),
    ("submit 201", rec("POST", "/jobs?priority=5", 201, job(), headers=["Location: /jobs/17"], req=SPEC_BODY),
     False),
    ("submit 201 without Location", rec("POST", "/jobs", 201, job(), req=SPEC_BODY), True),
    ("submit replay without Idempotent-Replayed",
     rec("POST", "/jobs", 200, job(), headers=["Location: /jobs/17"], req=SPEC_BODY), True),
    ("submit 201 undocumented query", rec("POST", "/jobs?colour=red", 201, job(), headers=["Location: /jobs/17"],
                                         req=SPEC_BODY), True),
    ("submit 201 out-of-range priority", rec("POST", "/jobs?priority=5000", 201, job(),
                                            headers=["Location: /jobs/17"], req=SPEC_BODY), True),
    ("submit 201 of a spec the schema refuses",
     rec("POST", "/jobs", 201, job(), headers=["Location: /jobs/17"], req=dict(SPEC_BODY, colour=1)), True),
    ("submit 400 of a bad spec", rec("POST", "/jobs", 400, err("invalid_spec"), req=dict(SPEC_BODY, colour=1)),
     False),
    ("job with an unknown state", rec("GET", "/jobs/17", 200, job(state="sleeping")), True),
    ("job with a bad timestamp", rec("GET", "/jobs/17", 200, job(submitted_at="yesterday")), True),
    ("job with a float id", rec("GET", "/jobs/17", 200, job(id=17.0)), True),
    # A Slurm job's preemption by a requeue (docs/slurm.md): its own record shape.
    ("job preempted by Slurm", rec("GET", "/jobs/17", 200, job(state="preempted", preemption=SLURM_PREEMPTION)),
     False),
    ("job preempted by Slurm without its Slurm job id",
     rec("GET", "/jobs/17", 200, job(state="preempted", preemption={
         k: v for k, v in SLURM_PREEMPTION.items() if k != "slurm_job_id"})), True),
    ("job preempted by a job named by a string", rec("GET", "/jobs/17", 200, job(state="preempted", preemption=dict(
        SLURM_PREEMPTION, by="job 5"))), True),
    ("job missing progress", rec("GET", "/jobs/17", 200, {k: v for k, v in JOB.items() if k != "progress"}), True),
    ("job 500", rec("GET", "/jobs/17", 500, err("internal")), True),
    ("delete 204", rec("DELETE", "/jobs/17", 204), False),
    ("delete 204 with a body", rec("DELETE", "/jobs/17", 204, {"deleted": True}), True),
    ("events ok", rec("GET", "/jobs/17/events", 200, SSE_OK, ctype="text/event-stream"), False),
    ("events bad state", rec("GET", "/jobs/17/events", 200, SSE_OK.replace('"running"', '"runnin"'),
                             ctype="text/event-stream"), True),
    ("events frame without id", rec("GET", "/jobs/17/events", 200, 'event: log\ndata: {}\n\n',
                                    ctype="text/event-stream"), True),
    ("events data not JSON", rec("GET", "/jobs/17/events", 200, 'id: 1\nevent: log\ndata: {\n\n',
                                 ctype="text/event-stream"), True),
    ("metrics push 202", rec("POST", "/jobs/17/metrics", 202, {"accepted": 1},
                             req={"points": [{"name": "bleu", "step": 1, "value": 0.5}]}), False),
    ("metrics push of an engine name accepted",
     rec("POST", "/jobs/17/metrics", 202, {"accepted": 1},
         req={"points": [{"name": "device3_step_ms", "step": 1, "value": 0.5}]}), True),
    ("metrics series with a string value",
     rec("GET", "/jobs/17/metrics?names=loss", 200, {"job": 17, "series": {"loss": {"steps": [1], "values": ["x"]}}}),
     True),
    ("logs ok", rec("GET", "/jobs/17/logs?limit=10", 200,
                    {"logs": [{"id": 1, "time": "2026-12-01T17:25:34.120Z", "level": 6, "message": "m"}], "next": None}), False),
    ("logs bad cursor", rec("GET", "/jobs/17/logs", 200, {"logs": [], "next": 5}), True),
    ("checkpoints list", rec("GET", "/jobs/17/checkpoints", 200, {"checkpoints": [CKPT]}), False),
    ("checkpoints list with a bad sha256", rec("GET", "/jobs/17/checkpoints", 200,
                                               {"checkpoints": [dict(CKPT, sha256="abc")]}), True),
    ("checkpoint requested", rec("POST", "/jobs/17/checkpoints", 202, {"requested": True, "job": 17}), False),
    ("model download", rec("GET", "/jobs/17/checkpoints/latest/model.safetensors", 200, "\u0008abc",
                           ctype=OCTETS, headers=MODEL_HEADERS + ["Content-Length: 4"]), False),
    ("model download of undecodable bytes", download("/jobs/17/checkpoints/200/model.safetensors", None,
                                                     MODEL_HEADERS + ["Content-Length: 9"]), False),
    ("model download shorter than Content-Length",
     rec("GET", "/jobs/17/checkpoints/200/model.safetensors", 200, "abc", ctype=OCTETS,
         headers=MODEL_HEADERS + ["Content-Length: 4"]), True),
    ("model download without Content-Length",
     rec("GET", "/jobs/17/checkpoints/200/model.safetensors", 200, "abc", ctype=OCTETS, headers=MODEL_HEADERS),
     True),
    ("model download as JSON", rec("GET", "/jobs/17/checkpoints/200/model.safetensors", 200, {"x": 1},
                                   headers=MODEL_HEADERS + ["Content-Length: 9"]), True),
    ("model download of a bad step", rec("GET", "/jobs/17/checkpoints/newest/model.safetensors", 200, "abc",
                                         ctype=OCTETS, headers=MODEL_HEADERS + ["Content-Length: 3"]), True),
    ("checkpoint download without ETag",
     rec("GET", "/jobs/17/checkpoints/200/checkpoint.safetensors", 200, "abc", ctype=OCTETS,
         headers=["Content-Length: 3", 'Content-Disposition: attachment; filename="job-17-step-200-checkpoint'
                  '.safetensors"']), True),
    ("checkpoint download 404", rec("GET", "/jobs/17/checkpoints/5/checkpoint.safetensors", 404,
                                    err("not_found")), False),
    ("HEAD of a download", download("/jobs/17/checkpoints/latest/model.safetensors", "",
                                    MODEL_HEADERS + ["Content-Length: 1234"], method="HEAD"), False),
    ("HEAD of a download with a body", download("/jobs/17/checkpoints/latest/model.safetensors", "abc",
                                                MODEL_HEADERS + ["Content-Length: 3"], method="HEAD"), True),
    ("HEAD with a body", rec("HEAD", "/jobs/17", 200, job()), True),
    ("HEAD of a POST-only path", rec("HEAD", "/jobs/17/cancel", 405, err("method_not_allowed"),
                                     headers=["Allow: POST"]), False),
    ("openapi yaml", rec("GET", "/openapi.yaml", 200, "openapi: 3.1.0\n", ctype="application/yaml"), False),
    ("openapi not yaml of a spec", rec("GET", "/openapi.yaml", 200, "- 1\n", ctype="application/yaml"), True),
]


def main():
    passed = failed = 0
    for what, exchange, want_problem in CASES:
        label, problems = vr.check_exchange(SPEC, exchange, False)
        if bool(problems) == want_problem:
            passed += 1
        else:
            failed += 1
            print("FAIL %s (%s): %s" % (what, label, "; ".join(problems) if problems else
                                        "no problem found, but there is one"))
    print("RESULT: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
