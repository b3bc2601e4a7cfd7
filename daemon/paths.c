/* Data-root confinement: a job may read only files under the daemon's data
 * roots.  Paths are resolved with realpath, so "..", symlinks and absolute
 * paths cannot escape a root. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/scheduler_internal.h"

static bool inside(const char *root, const char *path)
{
	size_t n = strlen(root);
	if (strcmp(root, "/") == 0)
		return true;
	return strncmp(root, path, n) == 0 && (path[n] == '/' || path[n] == 0);
}

/* Resolves one path; on success replaces *field with the absolute path. */
static int resolve_one(struct tr_scheduler *s, char **field, const char *ptr, char *pointer, size_t plen,
		       char *msg, size_t mlen)
{
	const char *p = *field;
	char buf[PATH_MAX * 2], real[PATH_MAX];
	bool outside = false;
	for (int i = 0; s->roots[i]; i++) {
		if (p[0] == '/')
			snprintf(buf, sizeof buf, "%s", p);
		else
			snprintf(buf, sizeof buf, "%s/%s", s->roots[i], p);
		if (!realpath(buf, real))
			continue;
		if (!inside(s->roots[i], real)) {
			outside = true;
			continue;
		}
		char *copy = strdup(real);
		if (!copy)
			break;
		free(*field);
		*field = copy;
		return 0;
	}
	snprintf(pointer, plen, "%s", ptr);
	if (outside)
		snprintf(msg, mlen, "%s: '%s' is outside the daemon's data roots", ptr, p);
	else
		snprintf(msg, mlen, "%s: no file '%s' in the daemon's data roots (%s%s)", ptr, p, s->roots[0],
			 s->roots[1] ? ", ..." : "");
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
	};
	for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
		if (!*fields[i].field)
			continue;
		char ptr[128];
		snprintf(ptr, sizeof ptr, "%s/%s", base, fields[i].key);
		if (resolve_one(s, fields[i].field, ptr, pointer, plen, msg, mlen) < 0)
			return -1;
	}
	return 0;
}

int tr_resolve_spec_paths(struct tr_scheduler *s, struct tr_spec *spec, char *pointer, size_t plen, char *msg,
			  size_t mlen)
{
	if (resolve_source(s, &spec->train, "/data/train", pointer, plen, msg, mlen) < 0 ||
	    resolve_source(s, &spec->validation, "/data/validation", pointer, plen, msg, mlen) < 0)
		return -1;
	if (spec->init_from && resolve_one(s, &spec->init_from, "/init/from", pointer, plen, msg, mlen) < 0)
		return -1;
	return 0;
}
