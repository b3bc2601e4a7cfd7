/* Declarations shared by the data readers in engine/data/ and nothing else.
 *
 * reader.c dispatches to the format openers below (defined in csv.c,
 * npy.c, idx.c and synthetic.c), which take already resolved paths.  The
 * error formatter and the read-only file mapping are defined once in
 * reader.c so every reader words its messages the same way.  Code outside
 * engine/data/ uses reader.h only.
 */
#ifndef TR_DATA_READER_INTERNAL_H
#define TR_DATA_READER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/data/reader.h"

int tr_csv_open(const struct tr_source_spec *src, const char *path, tr_reader_t **out, char *err,
		size_t errlen);
int tr_npy_open(const char *x_path, const char *y_path, tr_reader_t **out, char *err, size_t errlen);
int tr_idx_open(const char *images_path, const char *labels_path, tr_reader_t **out, char *err,
		size_t errlen);
int tr_synthetic_open(const struct tr_source_spec *src, uint64_t seed, tr_reader_t **out, char *err,
		      size_t errlen);

/* snprintf into err; does nothing when err is NULL or errlen is 0. */
void tr_data_errorf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Maps the regular file `path` read-only (MAP_PRIVATE).  `kind` names the
 * format with its article ("an IDX file", "a .npy file") for the message
 * when the file is not regular or is shorter than min_size bytes.  Returns
 * 0 with *map and *len set, or a negative code with err set to one of
 * "<path>: <strerror>", "<path>: not <kind> (too short|not a regular
 * file)" (-EINVAL) or "<path>: mmap: <strerror>"; *map and *len are left
 * alone on error. */
/* open(path, O_RDONLY) that, once data roots are set (tr_data_confine),
 * refuses a file that turns out to be outside them, whatever symlinks led
 * there (engine/data/confine.c).  A descriptor, or a negative errno with
 * err filled. */
int tr_data_open(const char *path, char *err, size_t errlen);
int tr_data_map_file(const char *path, size_t min_size, const char *kind, const void **map, size_t *len,
		     char *err, size_t errlen);
/* Undoes tr_data_map_file; accepts NULL. */
void tr_data_unmap_file(const void *map, size_t len);

#endif
