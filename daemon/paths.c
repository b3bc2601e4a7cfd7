/* Data-root confinement: a job may read only files under the daemon's data
 * roots.  Each path is opened with tr_data_open, beneath a descriptor of a
 * root, so "..", symlinks and absolute paths cannot leave it, and the spec
 * then names the file by the absolute path it opened as.  The check here
 * opens and closes; the readers open again through the same function when
 * the job starts and read only through their own descriptors, so a file
 * swapped after this check is confined just the same.
 *
 * A path that is missing and a path that leads out of the roots get the
 * same answer: anything else would tell a client which files exist
 * outside them.
 *
 * "dataset:NAME/FILE" names an uploaded file (storage/datasets.h): the
 * names are checked (no '/', no "..", nothing hidden) and the path becomes
 * the file beneath the datasets directory, which is one of the roots, so
 * it opens through the same confined open. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/scheduler_internal.h"
#include "storage/datasets.h"

/* Replaces a "dataset:NAME/FILE" *field by the file's path beneath the
 * datasets directory.  0 (also for other paths, left alone), -2 for a
 * malformed reference (a spec error: a name with '/', "..", a leading
 * '.'), or -1, with e filled. */
static int map_dataset(struct tr_scheduler *s, char **field, const char *ptr, struct tr_error *e)
{
	if (!tr_datasets_is_ref(*field))
		return 0;
	char name[TR_DATASET_NAME_MAX + 1], file[TR_DATASET_NAME_MAX + 1], path[PATH_MAX];
	struct tr_error why;
	if (!s->cfg.datasets_dir)
		return tr_error_set(e, -1, 0, ptr, "%s: this daemon keeps no datasets", ptr);
	if (tr_datasets_parse_ref(*field, name, file, &why) < 0)
		return tr_error_set(e, -2, 0, ptr, "%s: %s", ptr, why.message);
	if (snprintf(path, sizeof path, "%s/%s/%s", s->cfg.datasets_dir, name, file) >= (int)sizeof path)
		return tr_error_set(e, -1, 0, ptr, "%s: the dataset path is too long", ptr);
	char *copy = strdup(path);
	if (!copy)
		return tr_error_set(e, -1, 0, ptr, "%s: out of memory", ptr);
	free(*field);
	*field = copy;
	return 0;
}

/* Opens one path (a folder with want_dir: images, patches); on success
 * replaces *field with the absolute name. */
static int resolve_one(struct tr_scheduler *s, char **field, int want_dir, const char *ptr, struct tr_error *e)
{
	char shown[PATH_MAX + 256], ref[2 * TR_DATASET_NAME_MAX + 16] = "";
	struct tr_error why;
	if (tr_datasets_is_ref(*field))
		snprintf(ref, sizeof ref, "%s", *field);
	int mapped = map_dataset(s, field, ptr, e);
	if (mapped < 0)
		return mapped;
	int fd = want_dir ? tr_data_open_dir(s->roots, *field, shown, sizeof shown, &why)
			  : tr_data_open(s->roots, *field, NULL, shown, sizeof shown, &why);
	if (fd >= 0) {
		close(fd);
		char *copy = strdup(shown);
		if (!copy)
			return tr_error_set(e, -1, 0, ptr, "%s: out of memory", ptr);
		free(*field);
		*field = copy;
		return 0;
	}
	if (fd == -ENOENT && ref[0]) {
		tr_error_set(e, -1, 0, ptr,
			     "%s: no dataset file '%s'; upload it with PUT /datasets/%s (trainctl upload)", ptr, ref,
			     ref + strlen(TR_DATASET_REF_PREFIX));
	} else if (fd == -ENOENT) {
		char list[1024];
		tr_data_roots_describe(s->roots, list, sizeof list);
		tr_error_set(e, -1, 0, ptr,
			     "%s: no %s '%s' in the daemon's data roots (%s); paths resolve against the roots, "
			     "which are set with --data-root DIR or data-root lines in the config file",
			     ptr, want_dir ? "folder" : "file", *field, list);
	} else {
		tr_error_set(e, -1, 0, ptr, "%s: %s", ptr, why.message);
	}
	return -1;
}

int tr_resolve_spec_paths(struct tr_scheduler *s, struct tr_spec *spec, struct tr_error *e)
{
	struct tr_spec_path paths[TR_SPEC_MAX_PATHS];
	int n = tr_spec_paths(spec, paths), rc = 0;
	for (int i = 0; i < n && rc == 0; i++)
		rc = resolve_one(s, paths[i].field, paths[i].dir, paths[i].pointer, e);
	if (rc == 0 && spec->init_from)
		rc = resolve_one(s, &spec->init_from, 0, "/init/from", e);
	return rc;
}
