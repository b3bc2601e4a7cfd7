/* trainctl manifest: a job spec file as a cluster's objects, offline
 * (cli/k8s_manifest.h; docs/clusters.md).  The spec is checked as the
 * daemon checks it, so a manifest never carries a spec that its pods
 * would refuse. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli/k8s_manifest.h"
#include "cli/trainctl.h"
#include "cli/yaml.h"
#include "engine/spec.h"

static int print_manifest(const json_t *objects, bool as_json)
{
	if (as_json) {
		/* kubectl takes a List as one document */
		json_t *list = json_pack("{s:s, s:s, s:O}", "apiVersion", "v1", "kind", "List", "items", objects);
		int rc = list ? json_dumpf(list, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : -1;
		json_decref(list);
		if (rc == 0)
			putchar('\n');
		return rc;
	}
	printf("# Written by trainctl manifest --kubernetes; apply with kubectl apply -f.  The\n"
	       "# pods work in the data volume (a PersistentVolumeClaim, at " TR_K8S_DATA_DIR ") and write\n"
	       "# the job's outputs to " TR_K8S_OUT_DIR "/NAME on it (docs/clusters.md).\n");
	size_t i;
	json_t *obj;
	json_array_foreach(objects, i, obj) {
		fputs("---\n", stdout);
		if (tr_yaml_write(stdout, obj) < 0)
			return -1;
	}
	return 0;
}

static int parse_count(const char *flag, const char *v, int *out)
{
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (!*v || *end || errno || n < 0 || n > 64)
		return tr_ctl_usage("manifest", "%s: '%s' is not a count from 0 to 64", flag, v);
	*out = (int)n;
	return 0;
}

int tr_cmd_manifest(struct tr_ctl *c, int argc, char **argv)
{
	enum { O_NAME = 1000, O_NAMESPACE, O_IMAGE, O_GPUS, O_VOLUME, O_SECRET, O_FORMAT };
	static const struct option opts[] = {{"kubernetes", no_argument, NULL, 'k'},
					     {"name", required_argument, NULL, O_NAME},
					     {"namespace", required_argument, NULL, O_NAMESPACE},
					     {"image", required_argument, NULL, O_IMAGE},
					     {"gpus-per-pod", required_argument, NULL, O_GPUS},
					     {"data-volume", required_argument, NULL, O_VOLUME},
					     {"ssh-secret", required_argument, NULL, O_SECRET},
					     {"format", required_argument, NULL, O_FORMAT},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	struct tr_k8s_options o = {0};
	bool kubernetes = false, as_json = false;
	int ch;
	(void)c;
	opterr = 0; /* the usage error below names the option */
	while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (ch) {
		case 'k':
			kubernetes = true;
			break;
		case O_NAME:
			o.name = optarg;
			break;
		case O_NAMESPACE:
			o.namespace_ = optarg;
			break;
		case O_IMAGE:
			o.image = optarg;
			break;
		case O_GPUS:
			if (parse_count("--gpus-per-pod", optarg, &o.gpus_per_pod))
				return TR_CTL_USAGE;
			break;
		case O_VOLUME:
			o.data_volume = optarg;
			break;
		case O_SECRET:
			o.ssh_secret = optarg;
			break;
		case O_FORMAT:
			if (strcmp(optarg, "yaml") && strcmp(optarg, "json"))
				return tr_ctl_usage("manifest", "--format: '%s' is not yaml or json", optarg);
			as_json = !strcmp(optarg, "json");
			break;
		case 'h':
			return tr_ctl_help("manifest");
		case ':':
			return tr_ctl_usage("manifest", "%s: needs a value", argv[optind - 1]);
		default:
			return tr_ctl_usage("manifest", "unknown option %s", argv[optind - 1]);
		}
	}
	if (!kubernetes)
		return tr_ctl_usage("manifest", "--kubernetes: required (the one kind of manifest so far)");
	if (argc - optind != 1)
		return tr_ctl_usage("manifest", "expects one job spec file (or - for standard input)");
	const char *file = argv[optind];
	char *body = NULL;
	size_t len = 0;
	int rc = tr_ctl_read_input(file, &body, &len);
	if (rc)
		return rc;
	struct tr_spec spec;
	struct tr_error err;
	if (tr_spec_parse_text(body, &spec, &err) < 0) {
		free(body);
		fprintf(stderr, "trainctl manifest: %s: %s\n", file, err.message);
		return TR_CTL_USAGE;
	}
	free(body);
	char why[512];
	json_t *objects = tr_k8s_manifest(&spec, &o, why, sizeof why);
	tr_spec_finish(&spec);
	if (!objects) {
		fprintf(stderr, "trainctl manifest: %s%s%s\n", why[0] == '-' ? "" : file, why[0] == '-' ? "" : ": ",
			why);
		return TR_CTL_USAGE;
	}
	rc = print_manifest(objects, as_json);
	json_decref(objects);
	if (rc < 0 || fflush(stdout) != 0) {
		fprintf(stderr, "trainctl manifest: cannot write the manifest: %s\n", strerror(errno));
		return TR_CTL_LOCAL;
	}
	return TR_CTL_OK;
}
