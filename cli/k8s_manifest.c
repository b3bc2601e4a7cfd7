/* The Kubernetes objects of a job spec (cli/k8s_manifest.h). */
#include "cli/k8s_manifest.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_text.h"

static json_t *fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static json_t *fail(char *err, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, n, fmt, ap);
	va_end(ap);
	return NULL;
}

/* A DNS label (RFC 1123, as Kubernetes checks names): lowercase letters,
 * digits and '-', a letter or digit at both ends, 1..max characters; with
 * dots, a DNS subdomain of such labels. */
static bool dns_name(const char *s, size_t max, bool dots)
{
	size_t n = strlen(s);
	if (n == 0 || n > max || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[n - 1]))
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (dots && c == '.')))
			return false;
		if (c == '.' && (s[i + 1] == '.' || s[i + 1] == '-' || s[i - 1] == '-'))
			return false;
	}
	return true;
}

static int digits(int v)
{
	int d = 1;
	while (v >= 10) {
		v /= 10;
		d++;
	}
	return d;
}

/* The spec's name as a DNS label of at most max characters: lowercase,
 * every run of other characters one '-'; "trainerd" when nothing is left. */
static void name_from_spec(const char *spec_name, char *out, size_t max)
{
	size_t k = 0;
	for (const char *p = spec_name ? spec_name : ""; *p && k < max; p++) {
		char c = (char)tolower((unsigned char)*p);
		if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
			out[k++] = c;
		else if (k > 0 && out[k - 1] != '-')
			out[k++] = '-';
	}
	while (k > 0 && out[k - 1] == '-')
		k--;
	out[k] = '\0';
	if (k == 0)
		snprintf(out, max + 1, "trainerd");
}

/* The pods' script.  Pod 0 runs `trainerd run` in the data volume's job
 * folder, resuming from its checkpoint when there is one (a new pod 0
 * after a failure or an eviction, or the same Job applied again); with
 * several processes trainerd starts the ranks through mpirun, which
 * reaches the other pods over ssh (OMPI_MCA_* in the pod's environment).
 * Pods 1.. serve ssh until pod 0 writes them the job's end.  A TERM
 * (an eviction, a drain, a preemption) becomes a stop: every rank stops
 * after the step they agree on and process 0 keeps its checkpoint; pod 0
 * then exits TR_K8S_EXIT_RESUME, which asks for a new pod 0. */
static char *pod_script(const char *name, int procs)
{
	static const char body[] =
		"index=${JOB_COMPLETION_INDEX:?not a pod of an Indexed Job}\n"
		"done_file=/tmp/trainerd-done\n"
		"\n"
		"# The trainerd processes of this pod (the container's own).\n"
		"signal_ranks() {\n"
		"\tfor p in /proc/[0-9]*; do\n"
		"\t\t[ \"$(cat \"$p/comm\" 2>/dev/null)\" = trainerd ] && kill \"-$1\" \"${p#/proc/}\" 2>/dev/null\n"
		"\tdone\n"
		"\treturn 0\n"
		"}\n"
		"ranks_alive() {\n"
		"\tfor p in /proc/[0-9]*; do\n"
		"\t\t[ \"$(cat \"$p/comm\" 2>/dev/null)\" = trainerd ] && return 0\n"
		"\tdone\n"
		"\treturn 1\n"
		"}\n"
		"\n"
		"if [ \"$procs\" -gt 1 ]; then\n"
		"\thostkey=$(mktemp -d)/host_key\n"
		"\tssh-keygen -q -t ed25519 -N '' -f \"$hostkey\" || exit 1\n"
		"\tmkdir -p /run/sshd\n"
		"\t/usr/sbin/sshd -D -e -p \"$port\" -h \"$hostkey\" -o \"AuthorizedKeysFile=$keys/authorized_keys\" \\\n"
		"\t\t-o StrictModes=no -o UsePAM=no &\n"
		"\tsshd=$!\n"
		"fi\n"
		"\n"
		"if [ \"$index\" != 0 ]; then\n"
		"\t# TERM: this pod's rank asks for a stop, which every rank agrees on.\n"
		"\ttrap 'signal_ranks USR1; t=0; while ranks_alive && [ $t -lt 100 ]; do sleep 1; t=$((t + 1)); done; "
		"exit 143' TERM\n"
		"\twhile [ ! -f \"$done_file\" ]; do sleep 1; done\n"
		"\tkill \"$sshd\"\n"
		"\texit \"$(cat \"$done_file\")\"\n"
		"fi\n"
		"\n"
		"if [ \"$procs\" -gt 1 ]; then\n"
		"\t# every pod's sshd, for at most 10 minutes (ssh reads no stdin: the hostfile)\n"
		"\twhile read -r host _; do\n"
		"\t\tt=0\n"
		"\t\tuntil ssh $OMPI_MCA_plm_rsh_args \"$host\" true < /dev/null 2>/dev/null; do\n"
		"\t\t\tt=$((t + 1))\n"
		"\t\t\tif [ $t -gt 300 ]; then echo \"trainerd: $host does not answer ssh\" >&2; exit 1; fi\n"
		"\t\t\tsleep 2\n"
		"\t\tdone\n"
		"\tdone < \"$conf/hostfile\"\n"
		"fi\n"
		"if [ -f \"$out/checkpoint.safetensors\" ] && [ -f \"$out/spec.json\" ]; then\n"
		"\tset -- run --resume \"$out\"\n"
		"else\n"
		"\tmkdir -p \"$out\" || exit 1\n"
		"\tset -- run \"$conf/job.json\" --out \"$out\"\n"
		"fi\n"
		"echo \"trainerd: pod 0 of $procs: trainerd $*\"\n"
		"trainerd \"$@\" &\n"
		"pid=$!\n"
		"trap 'kill -TERM \"$pid\"' TERM\n"
		"# wait returns early when the trap runs: wait again until trainerd has ended.\n"
		"while :; do\n"
		"\twait \"$pid\"\n"
		"\trc=$?\n"
		"\tkill -0 \"$pid\" 2>/dev/null || break\n"
		"done\n"
		"# Stopped before its end: a new pod 0 resumes from the checkpoint.\n"
		"if [ \"$rc\" = 0 ] && ! grep -Eq '\"state\": ?\"completed\"' \"$out/summary.json\" 2>/dev/null; then\n"
		"\trc=%d\n"
		"fi\n"
		"if [ \"$rc\" = 0 ] && [ \"$procs\" -gt 1 ]; then\n"
		"\t# the other pods end too, so that every index succeeds (a minute each at most)\n"
		"\ttail -n +2 \"$conf/hostfile\" | while read -r host _; do\n"
		"\t\tt=0\n"
		"\t\tuntil ssh $OMPI_MCA_plm_rsh_args \"$host\" \"echo 0 > $done_file\" < /dev/null; do\n"
		"\t\t\tt=$((t + 1))\n"
		"\t\t\tif [ $t -gt 30 ]; then echo \"trainerd: cannot tell $host the job ended\" >&2; break; fi\n"
		"\t\t\tsleep 2\n"
		"\t\tdone\n"
		"\tdone\n"
		"\tkill \"$sshd\"\n"
		"fi\n"
		"exit \"$rc\"\n";
	char *s = NULL;
	if (asprintf(&s,
		     "# One pod of the trainerd job %s (trainctl manifest --kubernetes;\n"
		     "# docs/clusters.md).  Pod 0 runs the job; with several processes the\n"
		     "# other pods serve ssh for its mpirun until pod 0 says the job ended.\n"
		     "# It runs in the data volume (the working directory); its files are\n"
		     "# beside it (the ConfigMap's mount).\n"
		     "set -u\n"
		     "procs=%d\n"
		     "conf=$(cd \"$(dirname \"$0\")\" && pwd)\n"
		     "keys=/etc/trainerd-ssh\n"
		     "port=%d\n"
		     "out=$PWD/trainerd/%s\n",
		     name, procs, TR_K8S_SSH_PORT, name) < 0)
		return NULL;
	char *b = NULL;
	if (asprintf(&b, body, TR_K8S_EXIT_RESUME) < 0) {
		free(s);
		return NULL;
	}
	char *all = NULL;
	if (asprintf(&all, "%s%s", s, b) < 0)
		all = NULL;
	free(s);
	free(b);
	return all;
}

static json_t *labels(const char *name, bool managed)
{
	json_t *l = json_pack("{s:s, s:s}", "app.kubernetes.io/name", "trainerd", "app.kubernetes.io/instance", name);
	if (l && managed)
		json_object_set_new(l, "app.kubernetes.io/managed-by", json_string("trainctl"));
	return l;
}

static json_t *metadata(const char *name, const char *ns)
{
	return json_pack("{s:s, s:s, s:o}", "name", name, "namespace", ns, "labels", labels(name, true));
}

static json_t *config_map(const struct tr_spec *spec, const char *name, const char *ns, int procs, char *err,
			  size_t errlen)
{
	json_t *norm = tr_spec_to_json(spec);
	char *text = norm ? tr_json_dumps(norm, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	json_decref(norm);
	char *script = pod_script(name, procs);
	char *spec_text = NULL;
	if (!text || !script || asprintf(&spec_text, "%s\n", text) < 0) {
		free(text);
		free(script);
		return fail(err, errlen, "out of memory");
	}
	free(text);
	json_t *data = json_pack("{s:s, s:s}", "job.json", spec_text, "pod.sh", script);
	free(spec_text);
	free(script);
	if (data && procs > 1) {
		/* one slot a pod: rank r runs in pod r */
		size_t cap = (size_t)procs * 128;
		char *hosts = malloc(cap);
		size_t len = 0;
		for (int i = 0; hosts && i < procs; i++)
			len += (size_t)snprintf(hosts + len, cap - len, "%s-%d.%s.%s.svc slots=1\n", name, i, name, ns);
		if (hosts)
			json_object_set_new(data, "hostfile", json_string(hosts));
		free(hosts);
	}
	return json_pack("{s:s, s:s, s:o, s:o}", "apiVersion", "v1", "kind", "ConfigMap", "metadata",
			 metadata(name, ns), "data", data);
}

static json_t *service(const char *name, const char *ns, int procs)
{
	json_t *spec = json_pack("{s:s, s:b, s:o}", "clusterIP", "None", "publishNotReadyAddresses", 1, "selector",
				 labels(name, false));
	if (spec && procs > 1)
		json_object_set_new(spec, "ports",
				    json_pack("[{s:s, s:i, s:i}]", "name", "ssh", "port", TR_K8S_SSH_PORT, "targetPort",
					      TR_K8S_SSH_PORT));
	return json_pack("{s:s, s:s, s:o, s:o}", "apiVersion", "v1", "kind", "Service", "metadata", metadata(name, ns),
			 "spec", spec);
}

static json_t *container(const char *image, int procs, int gpus)
{
	json_t *mounts = json_pack("[{s:s, s:s, s:b}, {s:s, s:s}]", "name", "job", "mountPath", "/etc/trainerd",
				   "readOnly", 1, "name", "data", "mountPath", TR_K8S_DATA_DIR);
	json_t *c = json_pack("{s:s, s:s, s:[s, s], s:s}", "name", "trainerd", "image", image, "command", "sh",
			      "/etc/trainerd/pod.sh", "workingDir", TR_K8S_DATA_DIR);
	if (!c || !mounts) {
		json_decref(c);
		json_decref(mounts);
		return NULL;
	}
	if (procs > 1) {
		char args[256];
		snprintf(args, sizeof args,
			 "-p %d -i /etc/trainerd-ssh/id_ed25519 -o BatchMode=yes -o StrictHostKeyChecking=no "
			 "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
			 TR_K8S_SSH_PORT);
		/* Open MPI reads its parameters from OMPI_MCA_*.  It cuts a
		 * host's name at the first dot unless told to keep it, and
		 * NAME-I alone does not resolve (the pods' DNS names need the
		 * Service's subdomain).  A container runs as root, which Open
		 * MPI refuses unless told. */
		json_object_set_new(
			c, "env",
			json_pack("[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}, {s:s, s:s}, {s:s, s:s}, {s:s, s:s}]", "name",
				  "OMPI_MCA_orte_default_hostfile", "value", "/etc/trainerd/hostfile", "name",
				  "OMPI_MCA_orte_keep_fqdn_hostnames", "value", "1", "name", "OMPI_MCA_plm_rsh_agent",
				  "value", "ssh", "name", "OMPI_MCA_plm_rsh_args", "value", args, "name",
				  "OMPI_ALLOW_RUN_AS_ROOT", "value", "1", "name", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
				  "value", "1"));
		json_object_set_new(c, "ports",
				    json_pack("[{s:s, s:i}]", "name", "ssh", "containerPort", TR_K8S_SSH_PORT));
		json_array_append_new(mounts, json_pack("{s:s, s:s, s:b}", "name", "ssh", "mountPath",
							"/etc/trainerd-ssh", "readOnly", 1));
	}
	if (gpus > 0)
		json_object_set_new(c, "resources", json_pack("{s:{s:i}}", "limits", "nvidia.com/gpu", gpus));
	json_object_set_new(c, "volumeMounts", mounts);
	return c;
}

static json_t *job(const char *name, const char *ns, const struct tr_k8s_options *o, const char *image,
		   const char *volume, int procs)
{
	json_t *volumes = json_pack("[{s:s, s:{s:s}}, {s:s, s:{s:s}}]", "name", "job", "configMap", "name", name,
				    "name", "data", "persistentVolumeClaim", "claimName", volume);
	if (volumes && procs > 1)
		/* 0400: ssh refuses a private key that others may read */
		json_array_append_new(volumes, json_pack("{s:s, s:{s:s, s:i}}", "name", "ssh", "secret", "secretName",
							 o->ssh_secret, "defaultMode", 0400));
	json_t *pod = json_pack("{s:s, s:s, s:i, s:[o], s:o}", "subdomain", name, "restartPolicy", "Never",
				"terminationGracePeriodSeconds", TR_K8S_GRACE_S, "containers",
				container(image, procs, o->gpus_per_pod), "volumes", volumes);
	/* exit 2: the spec or its data is wrong, no retry helps; a resume
	 * and an eviction are no failures */
	json_t *policy =
		json_pack("{s:[{s:s, s:{s:s, s:s, s:[i]}}, {s:s, s:{s:s, s:s, s:[i]}}, {s:s, s:[{s:s, s:s}]}]}",
			  "rules", "action", "FailJob", "onExitCodes", "containerName", "trainerd", "operator", "In",
			  "values", 2, "action", "Ignore", "onExitCodes", "containerName", "trainerd", "operator", "In",
			  "values", TR_K8S_EXIT_RESUME, "action", "Ignore", "onPodConditions", "type",
			  "DisruptionTarget", "status", "True");
	json_t *spec = json_pack("{s:s, s:i, s:i, s:i, s:o, s:{s:{s:o}, s:o}}", "completionMode", "Indexed",
				 "completions", procs, "parallelism", procs, "backoffLimit", TR_K8S_BACKOFF_LIMIT,
				 "podFailurePolicy", policy, "template", "metadata", "labels", labels(name, false),
				 "spec", pod);
	return json_pack("{s:s, s:s, s:o, s:o}", "apiVersion", "batch/v1", "kind", "Job", "metadata",
			 metadata(name, ns), "spec", spec);
}

json_t *tr_k8s_manifest(const struct tr_spec *spec, const struct tr_k8s_options *o, char *err, size_t errlen)
{
	int procs = spec->processes;
	if (procs < 1)
		return fail(err, errlen,
			    "/processes: required: the Job runs one pod per process (\"processes\": 1 for one pod)");
	if (spec->resources.allocator == TR_ALLOC_SLURM)
		return fail(err, errlen,
			    "/resources/allocator: slurm: a Kubernetes Job is its own allocator; leave out "
			    "\"resources\"");
	/* "dataset:" paths name files uploaded to a daemon, which no pod has */
	struct tr_spec_path paths[TR_SPEC_MAX_PATHS];
	int npaths = tr_spec_paths((struct tr_spec *)spec, paths); /* only read here */
	for (int i = 0; i < npaths; i++)
		if (strncmp(*paths[i].field, "dataset:", 8) == 0)
			return fail(err, errlen,
				    "%s: %s names a file uploaded to a daemon, which the pods do not have; give its "
				    "path on the data volume (relative to " TR_K8S_DATA_DIR ")",
				    paths[i].pointer, *paths[i].field);
	if (spec->init_job > 0)
		return fail(err, errlen,
			    "/init/from: job %lld's checkpoint is the daemon's; give a safetensors file on the data "
			    "volume instead",
			    (long long)spec->init_job);
	int gpus = o->gpus_per_pod;
	if (gpus > 0 && procs > 1)
		return fail(err, errlen,
			    "--gpus-per-pod: a job of %d processes runs on CPU devices here (GPU ranks have "
			    "not run on a GPU, so the manifest does not offer them); leave it out",
			    procs);
	if (gpus > 0 && spec->backend == TR_BACKEND_CPU)
		return fail(err, errlen, "--gpus-per-pod: the spec's /backend is cpu: the GPUs would sit idle");
	if (gpus == 0 && spec->backend == TR_BACKEND_CUDA)
		return fail(err, errlen, "--gpus-per-pod: the spec's /backend is cuda: give the GPUs a pod needs");
	if (gpus > 0 && spec->n_device_ids == 0 && spec->device_count > gpus)
		return fail(err, errlen, "--gpus-per-pod: %d, but the spec's /devices asks for %d", gpus,
			    spec->device_count);
	if (gpus > 0 && spec->n_device_ids > 0)
		for (int i = 0; i < spec->n_device_ids; i++)
			if (spec->device_ids[i] >= gpus)
				return fail(err, errlen, "--gpus-per-pod: %d, but the spec's /devices/%d is device %d",
					    gpus, i, spec->device_ids[i]);

	/* The pods' hostnames are NAME-INDEX: a DNS label too. */
	size_t max = (size_t)(63 - 1 - digits(procs - 1));
	char name[64];
	if (o->name) {
		if (!dns_name(o->name, max, false))
			return fail(err, errlen,
				    "--name: '%s' is not a DNS label of at most %zu characters (lowercase letters, "
				    "digits and '-', a letter or digit at both ends)",
				    o->name, max);
		snprintf(name, sizeof name, "%s", o->name);
	} else {
		name_from_spec(spec->name, name, max);
	}
	const char *ns = o->namespace_ ? o->namespace_ : TR_K8S_DEFAULT_NAMESPACE;
	if (!dns_name(ns, 63, false))
		return fail(err, errlen, "--namespace: '%s' is not a DNS label (lowercase letters, digits and '-')",
			    ns);
	const char *volume = o->data_volume ? o->data_volume : TR_K8S_DEFAULT_VOLUME;
	if (!dns_name(volume, 253, true))
		return fail(err, errlen, "--data-volume: '%s' is not the name of a PersistentVolumeClaim", volume);
	struct tr_k8s_options opt = *o;
	if (!opt.ssh_secret)
		opt.ssh_secret = TR_K8S_DEFAULT_SSH_SECRET;
	if (!dns_name(opt.ssh_secret, 253, true))
		return fail(err, errlen, "--ssh-secret: '%s' is not the name of a Secret", opt.ssh_secret);
	char image[128];
	snprintf(image, sizeof image, "trainerd:%s", TR_VERSION);
	const char *img = o->image ? o->image : image;
	if (!*img)
		return fail(err, errlen, "--image: empty");
	for (const char *p = img; *p; p++)
		if ((unsigned char)*p <= ' ' || *p == 0x7f)
			return fail(err, errlen, "--image: '%s' holds a space or control character", img);

	json_t *cm = config_map(spec, name, ns, procs, err, errlen);
	if (!cm)
		return NULL;
	json_t *all = json_pack("[o, o, o]", cm, service(name, ns, procs), job(name, ns, &opt, img, volume, procs));
	return all ? all : fail(err, errlen, "out of memory");
}
