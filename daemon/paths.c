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
 * outside them. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/scheduler_internal.h"

/* Opens one path (a folder with want_dir: images, patches); on success
 * replaces *field with the absolute name. */
static int resolve_one(struct tr_scheduler *s, char **field, int want_dir, const char *ptr, char *pointer,
		       size_t plen, char *msg, size_t mlen)
{
	char shown[PATH_MAX + 256], why[1024];
	int fd = want_dir ? tr_data_open_dir(s->roots, *field, shown, sizeof shown, why, sizeof why)
			  : tr_data_open(s->roots, *field, NULL, shown, sizeof shown, why, sizeof why);
	if (fd >= 0) {
		close(fd);
		char *copy = strdup(shown);
		if (!copy) {
			snprintf(pointer, plen, "%s", ptr);
			snprintf(msg, mlen, "%s: out of memory", ptr);
			return -1;
		}
		free(*field);
		*field = copy;
		return 0;
	}
	snprintf(pointer, plen, "%s", ptr);
	if (fd == -ENOENT) {
		char list[1024];
		tr_data_roots_describe(s->roots, list, sizeof list);
		snprintf(msg, mlen,
			 "%s: no %s '%s' in the daemon's data roots (%s); paths resolve against the roots, "
			 "which are set with --data-root DIR or data-root lines in the config file",
			 ptr, want_dir ? "folder" : "file", *field, list);
	} else {
		snprintf(msg, mlen, "%s: %s", ptr, why);
	}
	return -1;
}

static int resolve_source(struct tr_scheduler *s, struct tr_source_spec *src, const char *base, char *pointer,
			  size_t plen, char *msg, size_t mlen)
{
	if (!src->present)
		return 0;
	struct {
		char **field;
		const char *key;
	} fields[] = {
		{&src->path, "path"},
		{&src->x_path, "x"},
		{&src->y_path, "y"},
		{&src->images_path, "images"},
		{&src->labels_path, "labels"},
		{&src->input_path, "input_path"},
		{&src->response_path, "response_path"},
	};
	/* Image sources name folders. */
	int dirs = src->format == TR_DATA_IMAGES || src->format == TR_DATA_PATCHES;
	for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
		if (!*fields[i].field)
			continue;
		char ptr[128];
		snprintf(ptr, sizeof ptr, "%s/%s", base, fields[i].key);
		if (resolve_one(s, fields[i].field, dirs, ptr, pointer, plen, msg, mlen) < 0)
			return -1;
	}
	return 0;
}

int tr_resolve_spec_paths(struct tr_scheduler *s, struct tr_spec *spec, char *pointer, size_t plen, char *msg,
			  size_t mlen)
{
	if (resolve_source(s, &spec->train, "/data/train", pointer, plen, msg, mlen) < 0 ||
	    resolve_source(s, &spec->validation, "/data/validation", pointer, plen, msg, mlen) < 0 ||
	    resolve_source(s, &spec->test, "/data/test", pointer, plen, msg, mlen) < 0)
		return -1;
	if (spec->init_from && resolve_one(s, &spec->init_from, 0, "/init/from", pointer, plen, msg, mlen) < 0)
		return -1;
	return 0;
}
