/* Data roots: the directories a job's files may come from, and the one
 * function that opens a data file.
 *
 * Every file a job reads by path (csv, npy and idx data, init.from) is
 * opened by tr_data_open, once, and then read only through the descriptor
 * it returns.  Checking a path by name and opening it by name again leaves
 * a window in which the file can be swapped for a symlink to anywhere, so
 * with roots the path is opened beneath a directory descriptor of a root:
 * neither "..", an absolute symlink nor a relative symlink that climbs out
 * leaves the root, whatever is renamed meanwhile (docs/design.md, "Data
 * roots").  Only regular files are accepted, checked on the opened
 * descriptor; the open itself is non-blocking, so a FIFO or a device node
 * is refused instead of hanging the job.
 *
 * Without roots (trainerd run, a person's own files) paths open as written,
 * relative ones against the working directory, with the same file checks.
 */
#ifndef TR_DATA_ROOTS_H
#define TR_DATA_ROOTS_H

#include <stddef.h>
#include <sys/stat.h>

#include "core/error.h"

typedef struct tr_data_roots tr_data_roots_t;

/* Opens each directory of the NULL-terminated list (at least one).  Fails
 * with the directory named in err when one cannot be opened as a
 * directory.  The caller frees the result with tr_data_roots_destroy. */
int tr_data_roots_create(const char *const *dirs, tr_data_roots_t **out, struct tr_error *err);
void tr_data_roots_destroy(tr_data_roots_t *r); /* accepts NULL */

/* The roots' real paths as "/a, /b", for messages; "" without roots. */
void tr_data_roots_describe(const tr_data_roots_t *r, char *buf, size_t len);

/* Opens `path` for reading.  With roots, a relative path is tried beneath
 * each root in order and an absolute one beneath the root it lies in (by
 * its spelling: nothing outside the roots is looked at).  Returns a
 * descriptor (O_RDONLY | O_CLOEXEC, blocking) of a regular file, which the
 * caller closes, with *st filled (may be NULL) and `shown` (may be NULL)
 * set to the name to give the file in messages and specs: the root's real
 * path joined with the relative path, or the path as written without
 * roots.  Errors, with a message in err that quotes the path as written:
 *   -ENOENT  no such file in the roots.  Also for a path that leads out of
 *            them, whether or not it exists there, so that the answer tells
 *            nothing about files outside the roots;
 *   -EINVAL  not a regular file (a directory, FIFO, socket or device);
 *   other    the open's errno (-EACCES, -ENAMETOOLONG, ...). */
int tr_data_open(const tr_data_roots_t *roots, const char *path, struct stat *st, char *shown, size_t shownlen,
		 struct tr_error *err);

/* Opens the directory `path` as tr_data_open opens a file (same roots,
 * same confinement, same messages): for image folders, whose files are
 * then opened with tr_data_open_in.  Returns an O_RDONLY | O_DIRECTORY
 * descriptor or a negative errno (-ENOTDIR for a file). */
int tr_data_open_dir(const tr_data_roots_t *roots, const char *path, char *shown, size_t shownlen,
		     struct tr_error *err);
/* Opens the entry `name` (one path component, as readdir gives it) of the
 * directory dir_fd: a regular file, or with want_dir a directory.  A
 * symlink is refused (O_NOFOLLOW), so nothing outside a directory opened
 * by tr_data_open_dir is reached.  Returns a descriptor (blocking) or a
 * negative errno with a message naming `name`. */
int tr_data_open_in(int dir_fd, const char *name, int want_dir, struct stat *st, struct tr_error *err);

/* For tests: the O_NOFOLLOW walk used where openat2 is missing, opening
 * `rel` beneath the directory root_fd with `flags`.  Returns a descriptor
 * or a negative errno (-EXDEV for a path that leaves the root). */
int tr_data_open_walk(int root_fd, const char *rel, int flags);
/* For tests: 1 when the walk is forced (as on a kernel without openat2). */
void tr_data_open_force_walk(int on);

#endif
