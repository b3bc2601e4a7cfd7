/* `download ID [STEP|latest|best] [-o FILE]`: a checkpoint to a file,
 * checked against the SHA-256 the daemon lists for it, resumable.
 *
 * The alias is resolved to a step first (latest from the list; best from
 * the ETag of the alias URL, which is the file's SHA-256), so the bytes
 * come from one fixed URL even if a newer checkpoint appears meanwhile.
 * Bytes go to FILE.part; an interrupted transfer leaves it, and the next
 * run (or the automatic retry) asks only for the rest with a Range and
 * If-Range: the checkpoint's ETag, so a part of some other file is never
 * completed with this one's bytes.  The whole file is hashed before it is
 * renamed to FILE: a mismatch deletes the part and exits 5, so a damaged
 * transfer never looks like a checkpoint.
 */
#include "cli/trainctl.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/sha256.h"

#define TRIES 3

struct dl {
	FILE *f;
	uint64_t have, total;
	bool tty;
	double last;
	bool failed; /* a local write failed */
};

static bool write_part(const char *data, size_t len, void *ud)
{
	struct dl *d = ud;

	if (fwrite(data, 1, len, d->f) != len) {
		d->failed = true;
		return false;
	}
	d->have += len;
	if (d->tty && tr_mono_now() - d->last > 0.2) {
		char a[32], b[32];

		d->last = tr_mono_now();
		tr_fmt_bytes(a, sizeof a, (double)d->have);
		tr_fmt_bytes(b, sizeof b, (double)d->total);
		fprintf(stderr, "\r\033[Kdownloading %s of %s (%d%%)", a, b,
			d->total ? (int)(100.0 * (double)d->have / (double)d->total) : 0);
	}
	return true;
}

static int hash_file(const char *path, char hex[65])
{
	static unsigned char buf[1 << 20];
	struct tr_sha256 h;
	FILE *f = fopen(path, "rb");
	size_t n;

	if (!f)
		return -errno;
	tr_sha256_init(&h);
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		tr_sha256_update(&h, buf, n);
	int bad = ferror(f);

	fclose(f);
	if (bad)
		return -EIO;
	tr_sha256_final_hex(&h, hex);
	return 0;
}

/* Finds the step, size and SHA-256 of the checkpoint `which` names. */
static int resolve(struct tr_ctl *c, int64_t id, const char *which, int64_t *step, uint64_t *bytes, char sha[65])
{
	struct tr_ctl_reply r, h;
	char path[160], want_sha[80] = "";
	int64_t want = -1;
	size_t i;
	json_t *ck;
	int rc;

	if (strcmp(which, "best") == 0) {
		/* The alias's ETag is the checkpoint's SHA-256. */
		snprintf(path, sizeof path, "/jobs/%" PRId64 "/checkpoints/best/checkpoint.safetensors", id);
		rc = tr_ctl_request(c, "HEAD", path, NULL, NULL, &h);
		if (rc)
			return rc;
		if (h.status != 200) {
			/* A HEAD answer has no body: ask for one byte to get the
			 * daemon's message. */
			const char *one[] = {"Range: bytes=0-0", NULL};

			tr_ctl_reply_finish(&h);
			rc = tr_ctl_request(c, "GET", path, NULL, one, &h);
			if (rc == 0)
				rc = tr_ctl_http_error(c, &h);
			tr_ctl_reply_finish(&h);
			return rc;
		}
		size_t n = strlen(h.etag);

		if (n == 66 && h.etag[0] == '"')
			snprintf(want_sha, sizeof want_sha, "%.64s", h.etag + 1);
		tr_ctl_reply_finish(&h);
	} else if (strcmp(which, "latest") != 0) {
		char *end;

		want = strtoll(which, &end, 10);
		if (*end || !*which || want < 0)
			return tr_ctl_usage("download", "not a step, latest or best: %s", which);
	}
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/checkpoints", id);
	rc = tr_ctl_call(c, "GET", path, NULL, &r);
	if (rc)
		return rc;
	*step = -1;
	json_array_foreach(json_object_get(r.json, "checkpoints"), i, ck) {
		int64_t s = json_integer_value(json_object_get(ck, "step"));
		const char *cs = json_string_value(json_object_get(ck, "sha256"));
		bool pick = want >= 0 ? s == want : want_sha[0] ? cs && strcmp(cs, want_sha) == 0 : s > *step;

		if (pick && cs) {
			*step = s;
			*bytes = (uint64_t)json_integer_value(json_object_get(ck, "bytes"));
			snprintf(sha, 65, "%s", cs);
		}
	}
	tr_ctl_reply_finish(&r);
	if (*step < 0) {
		if (want >= 0)
			fprintf(stderr, "trainctl: job %" PRId64 " has no checkpoint at step %" PRId64 "\n", id, want);
		else
			fprintf(stderr, "trainctl: job %" PRId64 " has no %s checkpoint\n", id, which);
		return TR_CTL_HTTP;
	}
	return TR_CTL_OK;
}

/* One attempt: asks for the bytes after what the part holds. */
static int fetch(struct tr_ctl *c, const char *url, const char *part, const char *sha, struct dl *d, char *err,
		 size_t errlen)
{
	struct tr_ctl_reply r;
	struct stat st;
	char range[64], if_range[96];
	const char *hdrs[3] = {NULL, NULL, NULL};
	int rc;

	d->have = stat(part, &st) == 0 ? (uint64_t)st.st_size : 0;
	/* total 0: the length is not known (the weights file), so no resume. */
	if (d->have > d->total)
		d->have = 0; /* not a part of this file */
	if (d->have == d->total && d->total > 0)
		return TR_CTL_OK;
	if (d->have > 0) {
		snprintf(range, sizeof range, "Range: bytes=%" PRIu64 "-", d->have);
		snprintf(if_range, sizeof if_range, "If-Range: \"%s\"", sha);
		hdrs[0] = range;
		hdrs[1] = if_range;
		if (c->verbose)
			fprintf(stderr, "trainctl: resuming %s at byte %" PRIu64 " of %" PRIu64 "\n", part, d->have,
				d->total);
	}
	d->f = fopen(part, d->have ? "ab" : "wb");
	if (!d->f) {
		snprintf(err, errlen, "%s: %s", part, strerror(errno));
		return TR_CTL_LOCAL;
	}
	/* A 200 to a Range is the whole file: start the part over.  Known
	 * only once the headers are in, so the part is reopened after a
	 * short first try when the server ignored the range. */
	rc = tr_ctl_stream(c, url, hdrs, write_part, d, &r, err, errlen);
	if (fclose(d->f) != 0 && !d->failed) {
		d->failed = true;
		snprintf(err, errlen, "%s: %s", part, strerror(errno));
	}
	d->f = NULL;
	if (d->failed) {
		tr_ctl_reply_finish(&r);
		if (!err[0])
			snprintf(err, errlen, "%s: cannot write", part);
		return TR_CTL_LOCAL;
	}
	if (rc == 0 && r.status == 200 && hdrs[0]) {
		/* The server sent the whole file after our part: keep its
		 * tail only by starting again without a range. */
		tr_ctl_reply_finish(&r);
		if (truncate(part, 0) < 0) {
			snprintf(err, errlen, "%s: %s", part, strerror(errno));
			return TR_CTL_LOCAL;
		}
		return fetch(c, url, part, sha, d, err, errlen);
	}
	if (rc == 0 && r.status != 200 && r.status != 206) {
		rc = tr_ctl_http_error(c, &r);
		tr_ctl_reply_finish(&r);
		return rc == TR_CTL_HTTP ? -TR_CTL_HTTP : rc; /* negative: do not retry */
	}
	tr_ctl_reply_finish(&r);
	if (rc == 0 && d->total && d->have != d->total) {
		snprintf(err, errlen, "the transfer ended at byte %" PRIu64 " of %" PRIu64, d->have, d->total);
		return TR_CTL_UNREACHABLE;
	}
	return rc;
}

int tr_cmd_download(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
					     {"weights", no_argument, NULL, 'w'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	const char *out = NULL, *which = "latest";
	bool weights = false;
	char name[160], part[1100], url[200], sha[65] = "", got[65], err[600] = "";
	struct dl d = {0};
	int64_t step = -1;
	uint64_t bytes = 0;
	int ch, rc;

	while ((ch = getopt_long(argc, argv, "o:wh", opts, NULL)) != -1) {
		switch (ch) {
		case 'o':
			out = optarg;
			break;
		case 'w':
			weights = true;
			break;
		case 'h':
			return tr_ctl_help("download");
		default:
			return tr_ctl_usage("download", "unknown option");
		}
	}
	if (argc - optind < 1 || argc - optind > 2)
		return tr_ctl_usage("download", "expects a job id and optionally a step, latest or best");
	int64_t id = tr_ctl_job_id("download", argv[optind]);

	if (id < 0)
		return TR_CTL_USAGE;
	if (argc - optind == 2)
		which = argv[optind + 1];
	rc = resolve(c, id, which, &step, &bytes, sha);
	if (rc)
		return rc;
	snprintf(name, sizeof name, "job-%" PRId64 "-step-%" PRId64 "-%s.safetensors", id, step,
		 weights ? "model" : "checkpoint");
	if (!out)
		out = name;
	snprintf(part, sizeof part, "%s.part", out);
	snprintf(url, sizeof url, "/jobs/%" PRId64 "/checkpoints/%" PRId64 "/%s.safetensors", id, step,
		 weights ? "model" : "checkpoint");
	/* The weights-only file is derived from the checkpoint and has no
	 * listed hash: it is fetched whole each time (total 0). */
	d.total = weights ? 0 : bytes;
	d.tty = isatty(STDERR_FILENO);
	if (weights)
		unlink(part);
	for (int t = 1;; t++) {
		err[0] = '\0';
		rc = fetch(c, url, part, sha, &d, err, sizeof err);
		if (d.tty)
			fprintf(stderr, "\r\033[K");
		if (rc != TR_CTL_UNREACHABLE || t == TRIES || weights)
			break;
		fprintf(stderr, "trainctl: %s; resuming (try %d of %d)\n", err, t + 1, TRIES);
		sleep(1);
	}
	if (rc < 0)
		return -rc;
	if (rc) {
		if (err[0])
			fprintf(stderr, "trainctl: %s\n", err);
		if (rc == TR_CTL_UNREACHABLE)
			fprintf(stderr, "trainctl: %s is kept; run the same command again to resume\n", part);
		return rc;
	}
	if (!weights) {
		if (hash_file(part, got) < 0) {
			fprintf(stderr, "trainctl: cannot read %s back: %s\n", part, strerror(errno));
			return TR_CTL_LOCAL;
		}
		if (strcmp(got, sha) != 0) {
			unlink(part);
			fprintf(stderr,
				"trainctl: %s: SHA-256 mismatch: the file has %s, the daemon lists %s; the download "
				"was discarded\n",
				out, got, sha);
			return TR_CTL_LOCAL;
		}
	}
	if (rename(part, out) < 0) {
		fprintf(stderr, "trainctl: cannot rename %s to %s: %s\n", part, out, strerror(errno));
		return TR_CTL_LOCAL;
	}
	struct stat st;
	char size[32];

	stat(out, &st);
	tr_fmt_bytes(size, sizeof size, (double)st.st_size);
	if (weights)
		printf("%s: %s, weights of step %" PRId64 "\n", out, size, step);
	else
		printf("%s: %s, step %" PRId64 ", sha256 %s verified\n", out, size, step, sha);
	return TR_CTL_OK;
}
