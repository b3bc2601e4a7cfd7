/* Datasets: files uploaded to the daemon and kept in its state directory,
 * so that a client of a remote daemon can give a job its data without
 * access to the server's file system.  A job names one as
 * "dataset:NAME/FILE" (daemon/paths.c maps it to the file below).
 *
 * Layout: "<dir>/NAME/FILE", with the file's SHA-256 recorded beside it in
 * "<dir>/NAME/.FILE.sha256" ("HEX BYTES INODE\n").  An upload streams into
 * a temporary file in NAME's directory (".upload-XXXXXX"), hashing as the
 * bytes arrive; its commit syncs it, writes the record, and renames it over
 * FILE, so a broken or refused upload leaves nothing under FILE's name
 * (and an old FILE stays whole until the new one is complete).  A record
 * whose inode or size does not match its file (a crash between the two
 * renames) is ignored and the checksum shown as unknown.  Leftover
 * temporary files are deleted at create.
 *
 * Names: NAME and FILE are 1 to TR_DATASET_NAME_MAX characters of
 * [A-Za-z0-9._-], not starting with '.', so neither can be "..", a hidden
 * file or a temporary file, and neither can contain a '/'.
 *
 * Quota: the files together (and uploads in progress, counted by what they
 * declared or have written) may take at most max_bytes; a file being
 * replaced counts as free.  Past it an upload fails with -EFBIG.
 * File count: at most max_files files (tr_datasets_set_max_files), counting
 * uploads in progress of new files; an upload of a new file past it fails
 * with -EMFILE at begin.  Replacing a file adds none.
 *
 * Errors are negative errno codes with the message in the caller's struct
 * tr_error (core/error.h; docs/design.md, "Errors"); err may be NULL.
 * All functions are safe to call from several threads.
 */
#ifndef TR_STORE_DATASETS_H
#define TR_STORE_DATASETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define TR_DATASET_NAME_MAX 128
/* The prefix of a job spec path that names a dataset file. */
#define TR_DATASET_REF_PREFIX "dataset:"

typedef struct tr_datasets tr_datasets_t;
typedef struct tr_dataset_upload tr_dataset_upload_t;

struct tr_dataset_file {
	char name[TR_DATASET_NAME_MAX + 1];
	char file[TR_DATASET_NAME_MAX + 1];
	int64_t bytes;
	char sha256[65]; /* lowercase hex; "" when unknown */
	double modified; /* Unix seconds of the upload's commit */
};

/* Opens (creating it, mode 0700) the datasets directory dir, which must be
 * an absolute path, deletes what interrupted uploads left, and sums the
 * files for the quota.  max_bytes <= 0: no quota.  Free with
 * tr_datasets_destroy. */
int tr_datasets_create(const char *dir, int64_t max_bytes, tr_datasets_t **out, struct tr_error *err);
void tr_datasets_destroy(tr_datasets_t *d); /* accepts NULL; no upload may be open */

const char *tr_datasets_dir(const tr_datasets_t *d);
int64_t tr_datasets_max_bytes(const tr_datasets_t *d); /* 0 = none */
/* The file-count limit (0 = none, the default). */
void tr_datasets_set_max_files(tr_datasets_t *d, int64_t max_files);
int64_t tr_datasets_max_files(tr_datasets_t *d);
/* Committed files now. */
int64_t tr_datasets_file_count(tr_datasets_t *d);
/* Bytes the committed files take now. */
int64_t tr_datasets_used_bytes(tr_datasets_t *d);

/* 0 when s is a valid name; -EINVAL with a message naming `what` ("dataset
 * name", "file name") and the rule otherwise. */
int tr_datasets_check_name(const char *what, const char *s, struct tr_error *err);
/* Whether path starts with TR_DATASET_REF_PREFIX. */
bool tr_datasets_is_ref(const char *path);
/* Splits "dataset:NAME/FILE" into name and file (each checked): 0, or
 * -EINVAL with a message. */
int tr_datasets_parse_ref(const char *ref, char name[TR_DATASET_NAME_MAX + 1], char file[TR_DATASET_NAME_MAX + 1],
			  struct tr_error *err);
/* "<dir>/NAME/FILE" (file NULL: "<dir>/NAME") into buf; -ENAMETOOLONG
 * when it does not fit. */
int tr_datasets_path(const tr_datasets_t *d, const char *name, const char *file, char *buf, size_t len);

/* Starts an upload of NAME/FILE.  declared: the body's size when known
 * (Content-Length), else -1.  -EINVAL for a bad name, -EFBIG when declared
 * does not fit the quota, -EMFILE when a new file would pass the file-count
 * limit (nothing is created then), another code when the
 * temporary file cannot be created. */
int tr_datasets_upload_begin(tr_datasets_t *d, const char *name, const char *file, int64_t declared,
			     tr_dataset_upload_t **out, struct tr_error *err);
/* Appends bytes.  -EFBIG past the quota or the declared size, -ENOSPC for
 * a full disk, -EIO otherwise.  After a failure only abort is left. */
int tr_datasets_upload_write(tr_dataset_upload_t *up, const void *data, size_t len, struct tr_error *err);
/* Bytes written so far. */
int64_t tr_datasets_upload_bytes(const tr_dataset_upload_t *up);
/* Makes the upload FILE (replacing an older one), fills *out (may be NULL)
 * and frees up, whatever the result; on failure nothing is left of it.
 * -EPROTO when fewer bytes came than were declared. */
int tr_datasets_upload_commit(tr_dataset_upload_t *up, struct tr_dataset_file *out, struct tr_error *err);
/* Deletes the partial upload and frees up.  Accepts NULL. */
void tr_datasets_upload_abort(tr_dataset_upload_t *up);

/* Every file, by name then file.  *files is malloc'd (NULL when none). */
int tr_datasets_list(tr_datasets_t *d, struct tr_dataset_file **files, size_t *count, struct tr_error *err);
/* One file's entry; -ENOENT when there is none. */
int tr_datasets_stat(tr_datasets_t *d, const char *name, const char *file, struct tr_dataset_file *out,
		     struct tr_error *err);
/* Deletes NAME/FILE, or with file NULL every file of NAME and NAME itself.
 * -ENOENT when there is no such file or dataset.  *freed (may be NULL)
 * receives the bytes given back. */
int tr_datasets_remove(tr_datasets_t *d, const char *name, const char *file, int64_t *freed, struct tr_error *err);

#endif
