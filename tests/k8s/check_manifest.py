#!/usr/bin/python3
"""Structure check of a `trainctl manifest --kubernetes` output, offline.

There is no cluster (or kubectl) to validate against, so this checks the
Kubernetes fields the manifest uses, as the API server and the Job
controller would read them (docs/clusters.md, "Kubernetes"):

  - one ConfigMap (v1), one Service (v1), one Job (batch/v1), in one
    namespace, with DNS-label names and valid labels;
  - only fields of the Kubernetes API in the objects written (a typo such
    as "completion" is caught, not ignored as kubectl --validate=false
    would);
  - the Service is headless (clusterIP: None) and its selector matches the
    pod template's labels; the Job's pods use it as their subdomain;
  - the Job is Indexed, completions == parallelism == the spec's
    "processes" (the job.json the ConfigMap carries);
  - a container with a name, an image and a command; the command's script
    is a key of the mounted ConfigMap and passes `sh -n`; every mount
    names a volume; the ConfigMap volume names the ConfigMap; pod failure
    policy rules name the container and use Never as restart policy;
  - with several pods, the hostfile lists the pods' DNS names
    (JOB-I.SERVICE.NAMESPACE.svc) in index order, and Open MPI's
    environment points at it.

Usage: check_manifest.py MANIFEST.yaml [MANIFEST.json]  (the JSON form of
the same manifest must hold the same objects)
       check_manifest.py --selftest MANIFEST.yaml  (every broken copy of a
valid manifest must be caught)
"""
import copy
import json
import re
import subprocess
import sys

import yaml

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")

# The fields of the Kubernetes API objects that the manifest may use (a
# subset of each kind's fields: those this generator writes or could).
KNOWN = {
    "object": {"apiVersion", "kind", "metadata", "data", "spec"},
    "metadata": {"name", "namespace", "labels", "annotations"},
    "service": {"clusterIP", "publishNotReadyAddresses", "selector", "ports"},
    "service_port": {"name", "port", "targetPort", "protocol"},
    "job": {"completionMode", "completions", "parallelism", "backoffLimit", "podFailurePolicy", "template",
            "selector", "manualSelector", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "suspend",
            "backoffLimitPerIndex", "maxFailedIndexes", "successPolicy"},
    "template": {"metadata", "spec"},
    "pod": {"subdomain", "hostname", "restartPolicy", "terminationGracePeriodSeconds", "containers", "volumes",
            "serviceAccountName", "securityContext", "nodeSelector", "tolerations", "affinity"},
    "container": {"name", "image", "command", "args", "workingDir", "env", "ports", "resources",
                  "volumeMounts", "securityContext", "imagePullPolicy"},
    "env": {"name", "value", "valueFrom"},
    "container_port": {"name", "containerPort", "protocol"},
    "mount": {"name", "mountPath", "readOnly", "subPath"},
    "volume": {"name", "configMap", "persistentVolumeClaim", "secret", "emptyDir"},
    "rule": {"action", "onExitCodes", "onPodConditions"},
    "on_exit": {"containerName", "operator", "values"},
    "on_condition": {"type", "status"},
}


class Problems(list):
    def need(self, cond, where, what):
        if not cond:
            self.append(f"{where}: {what}")
        return cond


def known(p, obj, kind, where):
    if not p.need(isinstance(obj, dict), where, "must be a mapping"):
        return False
    extra = set(obj) - KNOWN[kind]
    p.need(not extra, where, f"unknown field(s) {sorted(extra)}")
    return True


def check_labels(p, labels, where):
    if labels is None:
        return
    if not p.need(isinstance(labels, dict), where, "labels must be a mapping"):
        return
    for k, v in labels.items():
        p.need(isinstance(v, str) and len(v) <= 63 and LABEL_VALUE.match(v), f"{where}/{k}",
               f"not a label value: {v!r}")


def check(docs):
    p = Problems()
    by_kind = {}
    for i, d in enumerate(docs):
        if not known(p, d, "object", f"document {i}"):
            continue
        kind = d.get("kind")
        p.need(kind not in by_kind, f"document {i}", f"a second {kind}")
        by_kind[kind] = d
        want = {"ConfigMap": "v1", "Service": "v1", "Job": "batch/v1"}
        if p.need(kind in want, f"document {i}", f"kind {kind!r} is not ConfigMap, Service or Job"):
            p.need(d.get("apiVersion") == want[kind], kind, f"apiVersion must be {want[kind]}")
        md = d.get("metadata")
        if known(p, md, "metadata", f"{kind}/metadata"):
            p.need(isinstance(md.get("name"), str) and DNS_LABEL.match(md["name"]) and len(md["name"]) <= 63,
                   f"{kind}/metadata/name", f"not a DNS label: {md.get('name')!r}")
            check_labels(p, md.get("labels"), f"{kind}/metadata/labels")
    for kind in ("ConfigMap", "Service", "Job"):
        p.need(kind in by_kind, "manifest", f"no {kind}")
    if p:
        return p
    cm, svc, job = by_kind["ConfigMap"], by_kind["Service"], by_kind["Job"]
    namespaces = {d["metadata"].get("namespace") for d in docs}
    p.need(len(namespaces) == 1 and DNS_LABEL.match(str(next(iter(namespaces)))), "metadata/namespace",
           f"one namespace for all objects, got {sorted(map(str, namespaces))}")
    ns = next(iter(namespaces))

    # ConfigMap: string values; the spec
    data = cm.get("data")
    if not p.need(isinstance(data, dict) and all(isinstance(v, str) for v in data.values()), "ConfigMap/data",
                  "must map keys to strings"):
        return p
    try:
        spec = json.loads(data.get("job.json", ""))
    except ValueError as e:
        p.append(f"ConfigMap/data/job.json: not JSON: {e}")
        return p
    procs = spec.get("processes")
    p.need(isinstance(procs, int) and procs >= 1, "ConfigMap/data/job.json/processes", "must be a count")

    # Service: headless, selecting the pods
    ss = svc.get("spec")
    if not known(p, ss, "service", "Service/spec"):
        return p
    p.need(ss.get("clusterIP") == "None", "Service/spec/clusterIP", "must be None (headless)")
    for i, port in enumerate(ss.get("ports") or []):
        if known(p, port, "service_port", f"Service/spec/ports/{i}"):
            p.need(isinstance(port.get("port"), int) and 0 < port["port"] < 65536, f"Service/spec/ports/{i}/port",
                   "must be a port number")

    # Job
    js = job.get("spec")
    if not known(p, js, "job", "Job/spec"):
        return p
    p.need(js.get("completionMode") == "Indexed", "Job/spec/completionMode", "must be Indexed")
    c, par = js.get("completions"), js.get("parallelism")
    p.need(isinstance(c, int) and c >= 1, "Job/spec/completions", "must be a count")
    p.need(c == par, "Job/spec/parallelism", f"must equal completions ({c}), got {par}")
    p.need(c == procs, "Job/spec/completions", f"must equal the spec's processes ({procs}), got {c}")
    tmpl = js.get("template")
    if not known(p, tmpl, "template", "Job/spec/template"):
        return p
    tlabels = (tmpl.get("metadata") or {}).get("labels") or {}
    check_labels(p, tlabels, "Job/spec/template/metadata/labels")
    sel = ss.get("selector")
    p.need(isinstance(sel, dict) and sel and all(tlabels.get(k) == v for k, v in sel.items()),
           "Service/spec/selector", f"{sel} does not select the pods' labels {tlabels}")
    if "selector" in js:
        ml = (js["selector"] or {}).get("matchLabels") or {}
        p.need(js.get("manualSelector") is True, "Job/spec/selector", "needs manualSelector: true")
        p.need(ml and all(tlabels.get(k) == v for k, v in ml.items()), "Job/spec/selector",
               f"{ml} does not match the pod template's labels {tlabels}")
    pod = tmpl.get("spec")
    if not known(p, pod, "pod", "Job/spec/template/spec"):
        return p
    p.need(pod.get("subdomain") == svc["metadata"]["name"], "Job/spec/template/spec/subdomain",
           f"must be the headless Service's name {svc['metadata']['name']!r}")
    p.need(pod.get("restartPolicy") in ("Never", "OnFailure"), "Job/spec/template/spec/restartPolicy",
           "a Job's pods restart Never or OnFailure")
    volumes = {}
    for i, v in enumerate(pod.get("volumes") or []):
        if known(p, v, "volume", f"Job/spec/template/spec/volumes/{i}"):
            volumes[v.get("name")] = v
            if "configMap" in v:
                p.need(v["configMap"].get("name") == cm["metadata"]["name"], f"volumes/{i}/configMap/name",
                       "must name the manifest's ConfigMap")
            if "persistentVolumeClaim" in v:
                p.need(bool(v["persistentVolumeClaim"].get("claimName")), f"volumes/{i}", "needs claimName")
    containers = pod.get("containers")
    if not p.need(isinstance(containers, list) and containers, "Job/spec/template/spec/containers",
                  "at least one container"):
        return p
    names = set()
    for i, ct in enumerate(containers):
        where = f"Job/spec/template/spec/containers/{i}"
        if not known(p, ct, "container", where):
            continue
        names.add(ct.get("name"))
        p.need(isinstance(ct.get("name"), str) and DNS_LABEL.match(ct["name"]), f"{where}/name", "a DNS label")
        p.need(isinstance(ct.get("image"), str) and ct["image"] and not re.search(r"\s", ct["image"]),
               f"{where}/image", "an image reference")
        cmd = ct.get("command")
        if not p.need(isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd), f"{where}/command",
                      "a list of strings"):
            continue
        env = {}
        for k, e in enumerate(ct.get("env") or []):
            if known(p, e, "env", f"{where}/env/{k}"):
                env[e.get("name")] = e.get("value")
                p.need(isinstance(e.get("value"), str), f"{where}/env/{k}/value", "must be a string")
        for k, port in enumerate(ct.get("ports") or []):
            known(p, port, "container_port", f"{where}/ports/{k}")
        mounts = {}
        for k, m in enumerate(ct.get("volumeMounts") or []):
            if known(p, m, "mount", f"{where}/volumeMounts/{k}"):
                p.need(m.get("name") in volumes, f"{where}/volumeMounts/{k}", f"no volume {m.get('name')!r}")
                mounts[m.get("mountPath")] = volumes.get(m.get("name"))

        def config_file(path):
            """The ConfigMap key a path in the container is, or None."""
            d, _, key = path.rpartition("/")
            v = mounts.get(d)
            return key if v and "configMap" in v and key in data else None

        script = config_file(cmd[-1])
        if p.need(script is not None, f"{where}/command", f"{cmd[-1]} is no file of the mounted ConfigMap"):
            r = subprocess.run(["sh", "-n"], input=data[script], text=True, capture_output=True)
            p.need(r.returncode == 0, f"ConfigMap/data/{script}", f"sh -n: {r.stderr.strip()}")
        if isinstance(c, int) and c > 1:
            hf = env.get("OMPI_MCA_orte_default_hostfile")
            key = config_file(hf) if hf else None
            if p.need(key is not None, f"{where}/env", "OMPI_MCA_orte_default_hostfile names no mounted file"):
                want = [f"{job['metadata']['name']}-{k}.{svc['metadata']['name']}.{ns}.svc" for k in range(c)]
                got = [line.split()[0] for line in data[key].splitlines() if line.strip()]
                p.need(got == want, f"ConfigMap/data/{key}", f"hosts {got}, want the pods' names {want}")
    for i, rule in enumerate((js.get("podFailurePolicy") or {}).get("rules") or []):
        where = f"Job/spec/podFailurePolicy/rules/{i}"
        if known(p, rule, "rule", where):
            p.need(rule.get("action") in ("FailJob", "FailIndex", "Ignore", "Count"), f"{where}/action",
                   "FailJob, FailIndex, Ignore or Count")
            oe = rule.get("onExitCodes")
            if oe is not None and known(p, oe, "on_exit", f"{where}/onExitCodes"):
                p.need(oe.get("containerName") in names, f"{where}/onExitCodes/containerName", "no such container")
                p.need(oe.get("operator") in ("In", "NotIn"), f"{where}/onExitCodes/operator", "In or NotIn")
            for k, oc in enumerate(rule.get("onPodConditions") or []):
                known(p, oc, "on_condition", f"{where}/onPodConditions/{k}")
    if "podFailurePolicy" in js:
        p.need(pod.get("restartPolicy") == "Never", "Job/spec/template/spec/restartPolicy",
               "a pod failure policy needs Never")
    return p


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def breakages(docs):
    """Broken copies of a valid manifest, each with what broke."""
    def job(d):
        return next(x for x in d if x["kind"] == "Job")

    def svc(d):
        return next(x for x in d if x["kind"] == "Service")

    def cm(d):
        return next(x for x in d if x["kind"] == "ConfigMap")

    def pod(d):
        return job(d)["spec"]["template"]["spec"]

    edits = [
        ("parallelism differs", lambda d: job(d)["spec"].update(parallelism=job(d)["spec"]["completions"] + 1)),
        ("completions differ from processes", lambda d: job(d)["spec"].update(
            completions=job(d)["spec"]["completions"] + 1, parallelism=job(d)["spec"]["completions"] + 1)),
        ("not Indexed", lambda d: job(d)["spec"].update(completionMode="NonIndexed")),
        ("wrong apiVersion", lambda d: job(d).update(apiVersion="v1")),
        ("Service not headless", lambda d: svc(d)["spec"].pop("clusterIP")),
        ("Service selects other pods", lambda d: svc(d)["spec"]["selector"].update(
            {"app.kubernetes.io/instance": "other"})),
        ("subdomain not the Service", lambda d: pod(d).update(subdomain="elsewhere")),
        ("no command", lambda d: pod(d)["containers"][0].pop("command")),
        ("script not in the ConfigMap", lambda d: cm(d)["data"].pop("pod.sh")),
        ("script not shell", lambda d: cm(d)["data"].update({"pod.sh": "if then fi (\n"})),
        ("mount of no volume", lambda d: pod(d)["volumes"].pop(0)),
        ("a typo in a field", lambda d: job(d)["spec"].update(completion=job(d)["spec"].pop("completions"))),
        ("no Service", lambda d: d.remove(svc(d))),
        ("a bad name", lambda d: job(d)["metadata"].update(name="Not_A_Label")),
        ("selector without manualSelector", lambda d: job(d)["spec"].update(
            selector={"matchLabels": dict(job(d)["spec"]["template"]["metadata"]["labels"])})),
        ("processes differ", lambda d: cm(d)["data"].update({"job.json": json.dumps(
            dict(json.loads(cm(d)["data"]["job.json"]), processes=99))})),
    ]
    if job(docs)["spec"]["completions"] > 1:
        edits.append(("hostfile misses a pod", lambda d: cm(d)["data"].update(
            hostfile="".join(cm(d)["data"]["hostfile"].splitlines(True)[:-1]))))
        edits.append(("hostfile names another namespace", lambda d: cm(d)["data"].update(
            hostfile=cm(d)["data"]["hostfile"].replace(".svc", "x.svc"))))
    for what, edit in edits:
        d = copy.deepcopy(docs)
        edit(d)
        yield what, d


def main(argv):
    if len(argv) == 3 and argv[1] == "--selftest":
        docs = load(argv[2])
        bad = check(docs)
        if bad:
            print("selftest: the manifest itself fails:\n  " + "\n  ".join(bad))
            return 1
        missed = 0
        for what, d in breakages(docs):
            found = check(d)
            print(f"{'caught' if found else 'MISSED'}: {what}" + (f" ({found[0]})" if found else ""))
            missed += not found
        return 1 if missed else 0
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    docs = load(argv[1])
    problems = check(docs)
    if len(argv) == 3:
        with open(argv[2]) as f:
            j = json.load(f)
        if j.get("kind") != "List" or j.get("items") != docs:
            problems.append(f"{argv[2]}: not a List of the YAML's objects")
    for pr in problems:
        print(f"{argv[1]}: {pr}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
