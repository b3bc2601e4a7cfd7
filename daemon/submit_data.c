/* The data checks a submit makes when it can open the data then: the
 * trainer's own first checks (tr_trainer_check_data: model.inputs and the
 * layers against the data's shape, the loss against its labels, a patch
 * larger than an image), so such a spec is a 400 with its JSON pointer
 * instead of a job that waits in the queue and fails minutes later.  The
 * API thread opens the data, so only data small enough to open at once
 * is checked here (DATA_CHECK_MAX_BYTES on disk, or synthetic); larger
 * data is checked as before, when the job starts. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/job.h"
#include "daemon/scheduler_internal.h"
#include "engine/trainer.h"

/* Opening this much (a patches folder decodes every image) takes a
 * fraction of a second. */
#define DATA_CHECK_MAX_BYTES (16 << 20)
/* Bounds the walk of a folder: more entries than this count as large. */
#define DATA_CHECK_MAX_ENTRIES 4096

/* Adds path's bytes (a file, or a folder's files one level of folders
 * down) to *bytes; false when it is over the limit or cannot be read. */
static bool add_size(const char *path, int depth, int64_t *bytes, int *entries)
{
	struct stat st;
	if (!path || stat(path, &st) < 0)
		return false;
	if (S_ISREG(st.st_mode)) {
		*bytes += st.st_size;
		return *bytes <= DATA_CHECK_MAX_BYTES;
	}
	if (!S_ISDIR(st.st_mode) || depth > 1)
		return false;
	DIR *dir = opendir(path);
	if (!dir)
		return false;
	bool ok = true;
	struct dirent *e;
	while (ok && (e = readdir(dir))) {
		char child[PATH_MAX];
		if (e->d_name[0] == '.')
			continue;
		if (++*entries > DATA_CHECK_MAX_ENTRIES ||
		    snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child) {
			ok = false;
			break;
		}
		ok = add_size(child, depth + 1, bytes, entries);
	}
	closedir(dir);
	return ok;
}

static bool small_enough(const struct tr_source_spec *src)
{
	int64_t bytes = 0;
	int entries = 0;
	switch (src->format) {
	case TR_DATA_SYNTHETIC:
		return true; /* generated on demand */
	case TR_DATA_CSV:
	case TR_DATA_IMAGES:
		return add_size(src->path, 0, &bytes, &entries);
	case TR_DATA_NPY:
		return add_size(src->x_path, 0, &bytes, &entries) && add_size(src->y_path, 0, &bytes, &entries);
	case TR_DATA_IDX:
		return add_size(src->images_path, 0, &bytes, &entries) &&
		       add_size(src->labels_path, 0, &bytes, &entries);
	case TR_DATA_PATCHES:
		return src->path ? add_size(src->path, 0, &bytes, &entries)
				 : add_size(src->input_path, 0, &bytes, &entries) &&
					   add_size(src->response_path, 0, &bytes, &entries);
	}
	return false;
}

int tr_submit_check_data(struct tr_scheduler *s, const struct tr_spec *spec, struct tr_error *err)
{
	if (!spec->train.present || !small_enough(&spec->train))
		return 0;
	struct tr_error e = {0};
	if (tr_trainer_check_data(spec, s->roots, NULL, &e) == 0)
		return 0;
	return tr_job_fail(err, TR_JOB_E_INVALID_SPEC, e.pointer[0] ? e.pointer : "/data/train", "%s", e.message);
}
