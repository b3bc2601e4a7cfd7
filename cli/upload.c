/* `upload`, `datasets` and `rm-dataset`: data files given to the daemon
 * (PUT/GET/DELETE /datasets, docs/design.md "Datasets").
 *
 * An upload streams the file from disk (never held in memory) and hashes
 * it on the way, so the SHA-256 the daemon answers with is checked against
 * the bytes that were sent.  The daemon keeps nothing of a transfer that
 * breaks, so a retry simply sends the file again from its start.
 */
#include "cli/trainctl.h"

#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/sha256.h"

#define TRIES 3
#define NAME_MAX_LEN 128

struct src {
	FILE *f;
	struct tr_sha256 sha;
	int64_t sent, total;
	bool tty, failed;
	double last;
};

static size_t read_src(char *buf, size_t size, size_t n, void *ud)
{
	struct src *s = ud;
	size_t got = fread(buf, 1, size * n, s->f);

	if (got == 0 && ferror(s->f)) {
		s->failed = true;
		return CURL_READFUNC_ABORT;
	}
	tr_sha256_update(&s->sha, buf, got);
	s->sent += (int64_t)got;
	if (s->tty && (tr_mono_now() - s->last > 0.2 || s->sent == s->total)) {
		char a[32], b[32];

		s->last = tr_mono_now();
		tr_fmt_bytes(a, sizeof a, (double)s->sent);
		tr_fmt_bytes(b, sizeof b, (double)s->total);
		fprintf(stderr, "\r\033[Kuploading %s of %s (%d%%)", a, b,
			s->total ? (int)(100.0 * (double)s->sent / (double)s->total) : 100);
	}
	return got;
}

/* The daemon's naming rule (storage/datasets.h), checked here so that a
 * bad name is a usage error rather than a malformed URL. */
static bool valid_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > NAME_MAX_LEN || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-'))
			return false;
	}
	return true;
}

int tr_cmd_upload(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"as", required_argument, NULL, 'a'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	const char *as = NULL;
	int o;

	optind = 1;
	while ((o = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		if (o == 'a')
			as = optarg;
		else if (o == 'h')
			return tr_ctl_help("upload");
		else
			return tr_ctl_usage("upload", "unknown option");
	}
	if (argc - optind != 2)
		return tr_ctl_usage("upload", "needs a local file and a dataset name");
	const char *local = argv[optind], *dataset = argv[optind + 1];
	const char *base = strrchr(local, '/');
	const char *file = as ? as : base ? base + 1 : local;
	if (!valid_name(dataset) || !valid_name(file))
		return tr_ctl_usage("upload",
				    "'%s/%s': names are 1 to %d letters, digits, '.', '_' and '-', not starting with "
				    "'.' (use --as to name the file)",
				    dataset, file, NAME_MAX_LEN);

	struct src s = {0};
	struct stat st;
	s.f = fopen(local, "rb");
	if (!s.f || fstat(fileno(s.f), &st) < 0 || !S_ISREG(st.st_mode)) {
		fprintf(stderr, "trainctl: %s: %s\n", local, s.f ? "not a regular file" : strerror(errno));
		if (s.f)
			fclose(s.f);
		return TR_CTL_LOCAL;
	}
	s.total = st.st_size;
	s.tty = isatty(STDERR_FILENO);
	char path[400], err[512] = "";
	snprintf(path, sizeof path, "/datasets/%s/%s", dataset, file);

	struct tr_ctl_reply r = {0};
	int rc = TR_CTL_UNREACHABLE;
	for (int attempt = 1; attempt <= TRIES && rc == TR_CTL_UNREACHABLE; attempt++) {
		if (attempt > 1) {
			fprintf(stderr, "%strainctl: the upload broke off (%s); sending it again (try %d of %d)\n",
				s.tty ? "\r\033[K" : "", err, attempt, TRIES);
			sleep(1);
		}
		rewind(s.f);
		tr_sha256_init(&s.sha);
		s.sent = 0;
		s.failed = false;
		tr_ctl_reply_finish(&r);
		rc = tr_ctl_upload(c, path, read_src, &s, s.total, &r, err, sizeof err);
		if (s.failed) {
			fprintf(stderr, "%strainctl: %s: cannot read: %s\n", s.tty ? "\r\033[K" : "", local,
				strerror(errno));
			rc = TR_CTL_LOCAL;
		}
	}
	if (s.tty)
		fprintf(stderr, "\r\033[K");
	fclose(s.f);
	if (rc == TR_CTL_UNREACHABLE)
		fprintf(stderr, "trainctl: cannot upload to the daemon at %s: %s\n", c->url, err);
	if (rc) {
		tr_ctl_reply_finish(&r);
		return rc;
	}
	if (r.status == 507) {
		/* Not sent again: it would fill the same disk. */
		const char *msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
		fprintf(stderr, "trainctl: the daemon's disk is full (%s); free space on it and upload again\n",
			msg ? msg : "HTTP 507");
		tr_ctl_reply_finish(&r);
		return TR_CTL_HTTP;
	}
	if (r.status < 200 || r.status >= 300) {
		rc = tr_ctl_http_error(c, &r);
		tr_ctl_reply_finish(&r);
		return rc;
	}
	char hex[65], size[32];
	tr_sha256_final_hex(&s.sha, hex);
	const char *theirs = json_string_value(json_object_get(r.json, "sha256"));
	if (!theirs || strcmp(theirs, hex) != 0 || s.sent != st.st_size) {
		fprintf(stderr,
			"trainctl: %s: the daemon's SHA-256 %s is not the file's %s (did it change while being sent?)\n",
			local, theirs ? theirs : "(none)", hex);
		tr_ctl_reply_finish(&r);
		return TR_CTL_LOCAL;
	}
	tr_fmt_bytes(size, sizeof size, (double)s.sent);
	printf("%s  %s  sha256 %s\n", json_string_value(json_object_get(r.json, "path")), size, hex);
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

/* GET /datasets, every page (the API's cursor until it says there is no
 * more), into one reply: a dataset whose files run across pages is one
 * entry.  *out is the first page's object with "next" null. */
static int list_all_pages(struct tr_ctl *c, json_t **out)
{
	char path[400], after[2 * NAME_MAX_LEN + 2] = "";
	json_t *all = NULL;
	int rc = TR_CTL_OK;
	/* Bounded: a daemon holds at most datasets-max-files files, 1000 a page. */
	for (int page = 0; page < 100000; page++) {
		struct tr_ctl_reply r;
		snprintf(path, sizeof path, "/datasets?limit=1000%s%s", after[0] ? "&after=" : "", after);
		rc = tr_ctl_call(c, "GET", path, NULL, &r);
		if (rc)
			break;
		const char *next = json_string_value(json_object_get(r.json, "next"));
		bool more = next && strcmp(next, after) != 0;
		if (more)
			snprintf(after, sizeof after, "%s", next);
		if (!all) {
			all = json_incref(r.json);
		} else {
			json_t *sets = json_object_get(all, "datasets"), *d;
			size_t i;
			json_array_foreach(json_object_get(r.json, "datasets"), i, d) {
				json_t *last = json_array_get(sets, json_array_size(sets) - 1);
				const char *a = json_string_value(json_object_get(last, "name")),
					   *b = json_string_value(json_object_get(d, "name"));
				if (last && a && b && strcmp(a, b) == 0)
					json_array_extend(json_object_get(last, "files"), json_object_get(d, "files"));
				else
					json_array_append(sets, d);
			}
		}
		tr_ctl_reply_finish(&r);
		if (!more)
			break;
	}
	if (rc) {
		json_decref(all);
		return rc;
	}
	json_object_set_new(all, "next", json_null());
	*out = all;
	return TR_CTL_OK;
}

int tr_cmd_datasets(struct tr_ctl *c, int argc, char **argv)
{
	static const char *heads[] = {"PATH", "SIZE", "UPLOADED", "SHA256"};
	static const bool right[] = {false, true, false, false};
	struct tr_table t;
	size_t i, j;
	json_t *d, *f;

	if (tr_ctl_wants_help(argc, argv))
		return tr_ctl_help("datasets");
	if (argc >= 2 && strcmp(argv[1], "--json") != 0)
		return tr_ctl_usage("datasets", "takes no arguments but --json");
	json_t *all = NULL;
	int rc = list_all_pages(c, &all);
	if (rc)
		return rc;
	if (argc >= 2) {
		tr_print_json(all, stdout);
		json_decref(all);
		return TR_CTL_OK;
	}
	tr_table_init(&t, 4, heads, right);
	json_array_foreach(json_object_get(all, "datasets"), i, d) {
		json_array_foreach(json_object_get(d, "files"), j, f) {
			char size[32], when[32];

			tr_fmt_bytes(size, sizeof size, (double)json_integer_value(json_object_get(f, "bytes")));
			tr_fmt_time(when, sizeof when, json_string_value(json_object_get(f, "uploaded_at")));
			tr_table_add(&t, json_string_value(json_object_get(f, "path")), size, when,
				     json_string_value(json_object_get(f, "sha256")));
		}
	}
	tr_table_print(&t, stdout);
	tr_table_finish(&t);
	char used[32], max[48] = "no quota";
	const json_t *m = json_object_get(all, "max_bytes");
	tr_fmt_bytes(used, sizeof used, (double)json_integer_value(json_object_get(all, "used_bytes")));
	if (json_is_integer(m)) {
		char q[32];

		tr_fmt_bytes(q, sizeof q, (double)json_integer_value(m));
		snprintf(max, sizeof max, "of %s", q);
	}
	printf("%s used (%s)\n", used, max);
	json_decref(all);
	return TR_CTL_OK;
}

int tr_cmd_dataset_rm(struct tr_ctl *c, int argc, char **argv)
{
	struct tr_ctl_reply r;
	char path[400], name[NAME_MAX_LEN + 2] = "", size[32];

	if (tr_ctl_wants_help(argc, argv))
		return tr_ctl_help("rm-dataset");
	if (argc != 2)
		return tr_ctl_usage("rm-dataset", "needs DATASET or DATASET/FILE");
	const char *arg = argv[1];
	if (strncmp(arg, "dataset:", 8) == 0)
		arg += 8;
	const char *slash = strchr(arg, '/');
	size_t n = slash ? (size_t)(slash - arg) : strlen(arg);
	if (n <= NAME_MAX_LEN) {
		memcpy(name, arg, n);
		name[n] = '\0';
	}
	if (!valid_name(name) || (slash && !valid_name(slash + 1)))
		return tr_ctl_usage("rm-dataset", "'%s' is not DATASET or DATASET/FILE", argv[1]);
	snprintf(path, sizeof path, "/datasets/%s", arg);
	int rc = tr_ctl_call(c, "DELETE", path, NULL, &r);
	if (rc)
		return rc;
	tr_fmt_bytes(size, sizeof size, (double)json_integer_value(json_object_get(r.json, "freed_bytes")));
	printf("deleted %s (%s freed)\n", arg, size);
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}
