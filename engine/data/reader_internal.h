/* Declarations shared by the data readers in engine/data/ and nothing else.
 *
 * reader.c dispatches to the format openers below (defined in csv.c,
 * npy.c, idx.c, images.c, patches.c and synthetic.c), which take descriptors already opened by
 * tr_data_open (roots.h).  The error formatter and the guarded read-only
 * file mapping are defined once in reader.c so every reader words its
 * messages the same way.  Code outside
 * engine/data/ uses reader.h only.
 */
#ifndef TR_DATA_READER_INTERNAL_H
#define TR_DATA_READER_INTERNAL_H

#include <setjmp.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "engine/data/reader.h"

/* The format openers take descriptors from tr_data_open (which they own
 * from the call on, on success and on error) and the name to give each
 * file in messages.  `cancel` (may be NULL) interrupts a long parse. */
int tr_csv_open(const struct tr_source_spec *src, int fd, const char *name, const atomic_bool *cancel,
		tr_reader_t **out, struct tr_error *err);
int tr_npy_open(int x_fd, const char *x_name, int y_fd, const char *y_name, tr_reader_t **out, struct tr_error *err);
int tr_idx_open(int images_fd, const char *images_name, int labels_fd, const char *labels_name, tr_reader_t **out,
		struct tr_error *err);
/* images and patches take directory descriptors from tr_data_open_dir
 * (owned from the call on); patches' response_fd is -1 without
 * response_path. */
int tr_images_open(const struct tr_source_spec *src, int dir_fd, const char *dir_name, const atomic_bool *cancel,
		   tr_reader_t **out, struct tr_error *err);
int tr_patches_open(const struct tr_source_spec *src, int input_fd, const char *input_name, int response_fd,
		    const char *response_name, const atomic_bool *cancel, tr_reader_t **out, struct tr_error *err);
int tr_synthetic_open(const struct tr_source_spec *src, uint64_t seed, tr_reader_t **out, struct tr_error *err);

/* Replaces every byte of s that is not printable ASCII with '?', for the
 * few bytes of a file an error quotes (a bad field, a dtype): the message
 * shows what is wrong without carrying arbitrary bytes of the file. */
void tr_data_sanitize(char *s);

/* A data file mapped read-only.  The mapping follows the file, so a file
 * truncated or rewritten under a running job would show through it: reads
 * from the mapping go through TR_DATA_GUARD (a truncated page raises
 * SIGBUS, which then fails the read instead of killing the process), and
 * tr_data_map_check, called after each run of reads, fails the job when
 * the file's size or modification time changed since it was mapped
 * (docs/design.md, "Data files that change"). */
struct tr_data_map {
	const unsigned char *base;
	size_t len;
	int fd; /* kept for the check */
	struct timespec mtime;
	char name[256];
};

/* Maps the regular file fd (owned by the call, closed on error) read-only.
 * `kind` names the format with its article ("an IDX file") for the message
 * when the file is shorter than min_size bytes. */
int tr_data_map_open(int fd, const char *name, size_t min_size, const char *kind, struct tr_data_map *m,
		     struct tr_error *err);
/* Undoes tr_data_map_open; accepts a zeroed or already released map. */
void tr_data_map_release(struct tr_data_map *m);
/* 0 while the file is as it was mapped; otherwise -ESTALE with a message
 * naming it. */
int tr_data_map_check(const struct tr_data_map *m, struct tr_error *err);

/* Rate limit for a reader's check: 1 when at least TR_DATA_CHECK_MS passed
 * since the last time it said 1 for *last (CLOCK_MONOTONIC_COARSE ns; set
 * it to 0 at open, and to -1 when a check fails, so that every later call
 * checks again).  An fstat costs ~2.5 us here; checked after every row
 * range it was 6% of a core for a 64-128-10 model (bench/README.md).  A
 * step loaded within that interval after a rewrite may be trained on
 * before the next check fails the job, which then fails all the same. */
#define TR_DATA_CHECK_MS 5
int tr_data_check_due(_Atomic int64_t *last);

/* Reads of mapped files under a SIGBUS guard, on the calling thread:
 *
 *	sigjmp_buf jb;
 *	const struct tr_data_map *maps[] = {&a, &b};
 *	if (sigsetjmp(jb, 0))
 *		return tr_data_guard_failed(err);   // a page went away
 *	tr_data_guard_begin(&jb, maps, 2);
 *	... memcpy from a.base, b.base ...
 *	tr_data_guard_end();
 *
 * Between begin and end the code may only read the maps and write plain
 * memory (it is left by siglongjmp).  Guards do not nest. */
void tr_data_guard_begin(sigjmp_buf *jb, const struct tr_data_map *const *maps, int n);
void tr_data_guard_end(void);
/* Ends the guard after a fault and words the error (naming the file). */
int tr_data_guard_failed(struct tr_error *err);

#endif
