/* The checkpoint `trainerd run` keeps in its output directory.
 *
 * One file, DIR/checkpoint.safetensors, in the daemon's checkpoint format
 * (engine/checkpoint.h: weights, optimizer state, step), rewritten at every
 * checkpoint.every_steps and when the run ends or is stopped with Ctrl-C.
 * It is written to a temporary file, synced and renamed over the old one,
 * so a run killed mid-write keeps the previous checkpoint.  `--resume DIR`
 * reads it back; since the batch plan and every random draw are functions
 * of the step, the resumed run continues bit-identically (docs/design.md,
 * "trainerd run --resume").  Writes happen on the training thread: a
 * person's run has no daemon to hand them to, and a step or two of delay
 * per checkpoint is the price of the simplest correct thing.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/cli.h"
#include "engine/checkpoint.h"

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = write(fd, c, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

int tr_run_ckpt_write(const char *dir, const tr_model_t *m, enum tr_optim_type opt, const struct tr_snapshot *snap,
		      struct tr_error *err)
{
	char path[PATH_MAX], tmp[PATH_MAX + 8];
	struct tr_checkpoint_layout l;
	int rc = tr_checkpoint_layout(m, opt, snap, &l, err);
	if (rc < 0)
		return rc;
	snprintf(path, sizeof path, "%s/" TR_RUN_CKPT_NAME, dir);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", tmp, strerror(errno));
		goto out;
	}
	rc = write_all(fd, l.header, l.header_len);
	for (int k = 0; rc == 0 && k < l.nseg; k++)
		rc = write_all(fd, l.seg[k], l.seg_len[k]);
	if (rc == 0 && fsync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0) {
		tr_error_set(err, 0, 0, NULL, "%s: %s", path, strerror(-rc));
		unlink(tmp);
	}
out:
	tr_checkpoint_layout_finish(&l);
	return rc;
}

int tr_run_ckpt_read(const char *dir, const tr_model_t *m, enum tr_optim_type opt, struct tr_snapshot **out,
		     struct tr_error *err)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/" TR_RUN_CKPT_NAME, dir);
	FILE *f = fopen(path, "rb");
	if (!f) {
		int rc = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", path, strerror(errno));
		return rc;
	}
	struct stat st;
	void *data = NULL;
	int rc = 0;
	if (fstat(fileno(f), &st) < 0 || st.st_size <= 0) {
		tr_error_set(err, 0, 0, NULL, "%s: empty or unreadable", path);
		rc = -EINVAL;
	} else if (!(data = malloc((size_t)st.st_size))) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", path);
		rc = -ENOMEM;
	} else if (fread(data, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		tr_error_set(err, 0, 0, NULL, "%s: short read", path);
		rc = -EIO;
	}
	fclose(f);
	if (rc == 0) {
		struct tr_error why;
		rc = tr_checkpoint_parse(data, (size_t)st.st_size, m, opt, false, out, &why);
		if (rc < 0)
			tr_error_set(err, 0, 0, NULL, "%s: %s", path, why.message);
	}
	free(data);
	return rc;
}

int tr_run_metrics_truncate(const char *path, int64_t step)
{
	char tmp[PATH_MAX + 8], line[4096];
	FILE *in = fopen(path, "r");
	if (!in)
		return errno == ENOENT ? 0 : -errno;
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *out = fopen(tmp, "w");
	if (!out) {
		int rc = -errno;
		fclose(in);
		return rc;
	}
	/* Points after the checkpoint are replayed by the resumed run. */
	while (fgets(line, sizeof line, in)) {
		long long s;
		if (sscanf(line, "{\"step\":%lld,", &s) == 1 && s > step)
			continue;
		fputs(line, out);
	}
	fclose(in);
	int rc = ferror(out) ? -EIO : 0;
	if (fclose(out) != 0 && rc == 0)
		rc = -EIO;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0)
		unlink(tmp);
	return rc;
}
