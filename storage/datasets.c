/* Datasets in the state directory (storage/datasets.h): uploads streamed
 * into temporary files and renamed into place, their SHA-256 records, the
 * quota, listing and removal.
 *
 * One mutex guards the quota counters and every change of names (the
 * commit's two renames, removal, creating and removing a dataset's
 * directory), so concurrent uploads of one file cannot pair one upload's
 * bytes with the other's record, and a dataset's directory is never
 * removed under an upload that is about to create its temporary file.  The
 * bytes themselves are written outside it.
 */
#include "storage/datasets.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "storage/sha256.h"

#define TMP_PREFIX ".upload-"

struct tr_datasets {
	char *dir;
	int64_t max_bytes; /* 0 = none */
	pthread_mutex_t lock;
	int64_t used;      /* committed files; under lock */
	int64_t reserved;  /* uploads in progress; under lock */
	int64_t max_files; /* 0 = none */
	int64_t files;     /* committed files; under lock */
	int64_t new_slots; /* uploads in progress of a file that did not exist; under lock */
};

struct tr_dataset_upload {
	tr_datasets_t *d;
	char name[TR_DATASET_NAME_MAX + 1], file[TR_DATASET_NAME_MAX + 1];
	char tmp[PATH_MAX];
	int fd;
	int64_t declared; /* -1 = unknown */
	int64_t written;
	int64_t reserved; /* what this upload holds of d->reserved */
	int64_t replaces; /* bytes of the file it replaces, at the last reservation */
	bool new_slot;    /* holds one of d->new_slots */
	struct tr_sha256 sha;
	bool failed;
};

/* ---- names ---------------------------------------------------------------- */

int tr_datasets_check_name(const char *what, const char *s, struct tr_error *err)
{
	size_t n = s ? strlen(s) : 0;
	if (n == 0)
		return tr_error_set(err, -EINVAL, 0, NULL, "the %s is empty", what);
	if (n > TR_DATASET_NAME_MAX)
		return tr_error_set(err, -EINVAL, 0, NULL, "the %s is %zu characters long; at most %d are allowed",
				    what, n, TR_DATASET_NAME_MAX);
	if (s[0] == '.')
		return tr_error_set(
			err, -EINVAL, 0, NULL,
			"the %s '%.*s' starts with '.'; names are letters, digits, '.', '_' and '-', not starting "
			"with '.'",
			what, (int)(n < 40 ? n : 40), s);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
			  c == '_' || c == '-';
		if (!ok) {
			char shown[40];
			if (c > 0x20 && c < 0x7f)
				snprintf(shown, sizeof shown, "'%c'", c);
			else
				snprintf(shown, sizeof shown, "byte 0x%02x", c);
			return tr_error_set(
				err, -EINVAL, 0, NULL,
				"the %s has %s at position %zu; names are letters, digits, '.', '_' and '-', not "
				"starting with '.'",
				what, shown, i + 1);
		}
	}
	return 0;
}

bool tr_datasets_is_ref(const char *path)
{
	return path && strncmp(path, TR_DATASET_REF_PREFIX, strlen(TR_DATASET_REF_PREFIX)) == 0;
}

int tr_datasets_parse_ref(const char *ref, char name[TR_DATASET_NAME_MAX + 1], char file[TR_DATASET_NAME_MAX + 1],
			  struct tr_error *err)
{
	if (!tr_datasets_is_ref(ref))
		return tr_error_set(err, -EINVAL, 0, NULL, "not a dataset reference (dataset:NAME/FILE)");
	const char *p = ref + strlen(TR_DATASET_REF_PREFIX);
	const char *slash = strchr(p, '/');
	if (!slash)
		return tr_error_set(err, -EINVAL, 0, NULL, "'%.200s' names no file: write dataset:NAME/FILE", ref);
	size_t nlen = (size_t)(slash - p);
	if (nlen > TR_DATASET_NAME_MAX || strlen(slash + 1) > TR_DATASET_NAME_MAX)
		return tr_error_set(err, -EINVAL, 0, NULL, "'%.200s': names are at most %d characters", ref,
				    TR_DATASET_NAME_MAX);
	memcpy(name, p, nlen);
	name[nlen] = 0;
	snprintf(file, TR_DATASET_NAME_MAX + 1, "%s", slash + 1);
	struct tr_error why;
	if (tr_datasets_check_name("dataset name", name, &why) < 0 ||
	    tr_datasets_check_name("file name", file, &why) < 0)
		return tr_error_set(err, -EINVAL, 0, NULL, "'%.200s': %s", ref, why.message);
	return 0;
}

int tr_datasets_path(const tr_datasets_t *d, const char *name, const char *file, char *buf, size_t len)
{
	int n = file ? snprintf(buf, len, "%s/%s/%s", d->dir, name, file) : snprintf(buf, len, "%s/%s", d->dir, name);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* The record of NAME/FILE: "<dir>/NAME/.FILE.sha256". */
static int record_path(const tr_datasets_t *d, const char *name, const char *file, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/%s/.%s.sha256", d->dir, name, file);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- records ---------------------------------------------------------------- */

/* Reads NAME/FILE's record into out->sha256 when it matches st (same inode
 * and size); leaves "" otherwise. */
static void read_record(const tr_datasets_t *d, const char *name, const char *file, const struct stat *st,
			struct tr_dataset_file *out)
{
	char path[PATH_MAX];
	out->sha256[0] = 0;
	if (record_path(d, name, file, path, sizeof path) < 0)
		return;
	FILE *f = fopen(path, "re");
	if (!f)
		return;
	char hex[65];
	long long bytes = -1;
	unsigned long long ino = 0;
	if (fscanf(f, "%64s %lld %llu", hex, &bytes, &ino) == 3 && strlen(hex) == 64 &&
	    bytes == (long long)st->st_size && ino == (unsigned long long)st->st_ino)
		memcpy(out->sha256, hex, 65);
	fclose(f);
}

static int sync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) == 0 ? 0 : -errno;
	close(fd);
	return rc;
}

/* Writes the record of a file with this digest, size and inode to path
 * (through a temporary name, synced). */
static int write_record(const char *path, const char *hex, int64_t bytes, uint64_t ino, struct tr_error *err)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
		return tr_error_set(err, -ENAMETOOLONG, 0, NULL, "%s: name too long", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return tr_error_set(err, -errno, 0, NULL, "%s: cannot create: %s", tmp, strerror(errno));
	char line[128];
	int n = snprintf(line, sizeof line, "%s %" PRId64 " %" PRIu64 "\n", hex, bytes, ino);
	int rc = write(fd, line, (size_t)n) == n && fsync(fd) == 0 ? 0 : -(errno ? errno : EIO);
	close(fd);
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0) {
		unlink(tmp);
		return tr_error_set(err, rc, 0, NULL, "%s: cannot write: %s", path, strerror(-rc));
	}
	return 0;
}

/* ---- lifecycle ---------------------------------------------------------------- */

/* Deletes what interrupted uploads left in one dataset's directory and
 * adds its files' sizes to *used; removes the directory when it is empty. */
static void sweep_dataset(int top, const char *name, int64_t *used, int64_t *files)
{
	/* Beneath the datasets directory's descriptor, following no link: the
	 * cleanup deletes files, and must delete only its own. */
	int fd = openat(top, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
	if (!dir) {
		if (fd >= 0)
			close(fd);
		return;
	}
	struct dirent *e;
	struct stat st;
	while ((e = readdir(dir))) {
		const char *n = e->d_name;
		if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0)
			continue;
		if (strncmp(n, TMP_PREFIX, strlen(TMP_PREFIX)) == 0 ||
		    (n[0] == '.' && strlen(n) > 4 && strcmp(n + strlen(n) - 4, ".tmp") == 0)) {
			unlinkat(dirfd(dir), n, 0);
			continue;
		}
		if (n[0] != '.' && fstatat(dirfd(dir), n, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
			*used += st.st_size;
			++*files;
		}
	}
	closedir(dir);
	unlinkat(top, name, AT_REMOVEDIR); /* only when empty */
}

int tr_datasets_create(const char *dir, int64_t max_bytes, tr_datasets_t **out, struct tr_error *err)
{
	*out = NULL;
	if (!dir || dir[0] != '/')
		return tr_error_set(err, -EINVAL, 0, NULL, "the datasets directory must be an absolute path");
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return tr_error_set(err, -errno, 0, NULL, "%s: cannot create: %s", dir, strerror(errno));
	/* Not a link: one planted there would lead uploads, deletions and the
	 * cleanup below into someone else's folder. */
	int top = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (top < 0) {
		struct stat st;
		if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode))
			return tr_error_set(err, -ELOOP, 0, NULL,
					    "%s is a symbolic link; the datasets directory must be a directory of the "
					    "daemon's own (remove the link)",
					    dir);
		return tr_error_set(err, -ENOTDIR, 0, NULL, "%s: not a directory", dir);
	}
	tr_datasets_t *d = calloc(1, sizeof *d);
	if (!d || !(d->dir = strdup(dir))) {
		free(d);
		close(top);
		return tr_error_set(err, -ENOMEM, 0, NULL, "out of memory");
	}
	d->max_bytes = max_bytes > 0 ? max_bytes : 0;
	pthread_mutex_init(&d->lock, NULL);
	DIR *list = fdopendir(dup(top));
	struct dirent *e;
	while (list && (e = readdir(list)))
		if (e->d_name[0] != '.' && tr_datasets_check_name("dataset name", e->d_name, NULL) == 0)
			sweep_dataset(top, e->d_name, &d->used, &d->files);
	if (list)
		closedir(list);
	close(top);
	*out = d;
	return 0;
}

void tr_datasets_destroy(tr_datasets_t *d)
{
	if (!d)
		return;
	pthread_mutex_destroy(&d->lock);
	free(d->dir);
	free(d);
}

const char *tr_datasets_dir(const tr_datasets_t *d)
{
	return d->dir;
}

int64_t tr_datasets_max_bytes(const tr_datasets_t *d)
{
	return d->max_bytes;
}

void tr_datasets_set_max_files(tr_datasets_t *d, int64_t max_files)
{
	pthread_mutex_lock(&d->lock);
	d->max_files = max_files > 0 ? max_files : 0;
	pthread_mutex_unlock(&d->lock);
}

int64_t tr_datasets_max_files(tr_datasets_t *d)
{
	pthread_mutex_lock(&d->lock);
	int64_t v = d->max_files;
	pthread_mutex_unlock(&d->lock);
	return v;
}

int64_t tr_datasets_file_count(tr_datasets_t *d)
{
	pthread_mutex_lock(&d->lock);
	int64_t v = d->files;
	pthread_mutex_unlock(&d->lock);
	return v;
}

int64_t tr_datasets_used_bytes(tr_datasets_t *d)
{
	pthread_mutex_lock(&d->lock);
	int64_t v = d->used;
	pthread_mutex_unlock(&d->lock);
	return v;
}

/* ---- quota ---------------------------------------------------------------- */

/* Takes `more` bytes of the quota for up (under d->lock): -EFBIG when they
 * do not fit.  The file up replaces counts as free. */
/* The size of the file up replaces as it is now (under d->lock): another
 * upload may have replaced it, or a delete removed it, since up began, and
 * counting what it was then let each round of that grow the used bytes by
 * the replaced file's size past the quota. */
static int64_t replaced_now_locked(const tr_dataset_upload_t *up)
{
	char fpath[PATH_MAX];
	struct stat st;
	if (tr_datasets_path(up->d, up->name, up->file, fpath, sizeof fpath) < 0)
		return 0;
	return lstat(fpath, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : 0;
}

static int reserve_locked(tr_dataset_upload_t *up, int64_t more, struct tr_error *err)
{
	tr_datasets_t *d = up->d;
	up->replaces = replaced_now_locked(up);
	if (d->max_bytes > 0) {
		int64_t after = d->used - up->replaces + d->reserved + more;
		if (after > d->max_bytes) {
			int64_t room = d->max_bytes - (d->used - up->replaces + d->reserved);
			return tr_error_set(err, -EFBIG, 0, NULL,
					    "%s/%s: %" PRId64 " bytes do not fit the datasets quota of %" PRId64
					    " bytes (%" PRId64 " left; datasets-max-bytes sets it)",
					    up->name, up->file, up->reserved + more, d->max_bytes,
					    (room > 0 ? room : 0) + up->reserved);
		}
	}
	d->reserved += more;
	up->reserved += more;
	return 0;
}

/* Takes a place among max_files for an upload of a file that does not
 * exist yet (under d->lock): -EMFILE when the files and the new files
 * being uploaded fill them.  Empty files take no quota bytes but an inode
 * each, and enough of them exhausted a file system's inodes. */
static int take_file_slot_locked(tr_dataset_upload_t *up, const char *fpath, struct tr_error *err)
{
	tr_datasets_t *d = up->d;
	struct stat st;
	if (lstat(fpath, &st) == 0)
		return 0; /* a replacement adds no file */
	if (d->max_files > 0 && d->files + d->new_slots >= d->max_files)
		return tr_error_set(err, -EMFILE, 0, NULL,
				    "%s/%s: the datasets hold %" PRId64 " files (with uploads in progress), the limit "
				    "of %" PRId64 " files (datasets-max-files sets it)",
				    up->name, up->file, d->files + d->new_slots, d->max_files);
	d->new_slots++;
	up->new_slot = true;
	return 0;
}

/* ---- uploads ---------------------------------------------------------------- */

int tr_datasets_upload_begin(tr_datasets_t *d, const char *name, const char *file, int64_t declared,
			     tr_dataset_upload_t **out, struct tr_error *err)
{
	*out = NULL;
	int rc = tr_datasets_check_name("dataset name", name, err);
	if (rc == 0)
		rc = tr_datasets_check_name("file name", file, err);
	if (rc < 0)
		return rc;
	tr_dataset_upload_t *up = calloc(1, sizeof *up);
	if (!up)
		return tr_error_set(err, -ENOMEM, 0, NULL, "out of memory");
	up->d = d;
	up->fd = -1;
	up->declared = declared;
	snprintf(up->name, sizeof up->name, "%s", name);
	snprintf(up->file, sizeof up->file, "%s", file);
	tr_sha256_init(&up->sha);

	char dpath[PATH_MAX], fpath[PATH_MAX];
	if (tr_datasets_path(d, name, NULL, dpath, sizeof dpath) < 0 ||
	    tr_datasets_path(d, name, file, fpath, sizeof fpath) < 0 ||
	    snprintf(up->tmp, sizeof up->tmp, "%s/" TMP_PREFIX "XXXXXX", dpath) >= (int)sizeof up->tmp) {
		free(up);
		return tr_error_set(err, -ENAMETOOLONG, 0, NULL, "%s/%s: the path is too long", name, file);
	}
	pthread_mutex_lock(&d->lock);
	rc = reserve_locked(up, declared > 0 ? declared : 0, err);
	if (rc == 0)
		rc = take_file_slot_locked(up, fpath, err);
	if (rc == 0 && mkdir(dpath, 0700) < 0 && errno != EEXIST)
		rc = tr_error_set(err, -errno, 0, NULL, "%s: cannot create: %s", dpath, strerror(errno));
	if (rc == 0 && (up->fd = mkostemp(up->tmp, O_CLOEXEC)) < 0)
		rc = tr_error_set(err, -errno, 0, NULL, "%s: cannot create a file: %s", dpath, strerror(errno));
	if (rc < 0) {
		d->reserved -= up->reserved;
		d->new_slots -= up->new_slot;
		rmdir(dpath); /* a dataset this upload would have started */
	}
	pthread_mutex_unlock(&d->lock);
	if (rc < 0) {
		free(up);
		return rc;
	}
	*out = up;
	return 0;
}

int tr_datasets_upload_write(tr_dataset_upload_t *up, const void *data, size_t len, struct tr_error *err)
{
	if (up->failed)
		return tr_error_set(err, -EIO, 0, NULL, "%s/%s: the upload has failed", up->name, up->file);
	int rc = 0;
	if (up->declared >= 0 && (uint64_t)up->written + len > (uint64_t)up->declared) {
		rc = tr_error_set(err, -EFBIG, 0, NULL, "%s/%s: more bytes came than the %" PRId64 " declared",
				  up->name, up->file, up->declared);
	} else if (up->written + (int64_t)len > up->reserved) {
		pthread_mutex_lock(&up->d->lock);
		rc = reserve_locked(up, up->written + (int64_t)len - up->reserved, err);
		pthread_mutex_unlock(&up->d->lock);
	}
	const char *p = data;
	size_t left = len;
	while (rc == 0 && left) {
		ssize_t n = write(up->fd, p, left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;
			rc = tr_error_set(err, e == ENOSPC || e == EDQUOT ? -ENOSPC : -EIO, 0, NULL,
					  "%s/%s: cannot write: %s", up->name, up->file, strerror(e));
			break;
		}
		p += n;
		left -= (size_t)n;
	}
	if (rc < 0) {
		up->failed = true;
		return rc;
	}
	tr_sha256_update(&up->sha, data, len);
	up->written += (int64_t)len;
	return 0;
}

int64_t tr_datasets_upload_bytes(const tr_dataset_upload_t *up)
{
	return up->written;
}

/* Gives back the upload's reservation and frees it (the temporary file
 * already renamed or deleted). */
static void upload_free(tr_dataset_upload_t *up, int64_t committed)
{
	tr_datasets_t *d = up->d;
	pthread_mutex_lock(&d->lock);
	d->reserved -= up->reserved;
	d->new_slots -= up->new_slot;
	d->used += committed;
	if (!committed) {
		/* A dataset that only this upload had started goes with it. */
		char dpath[PATH_MAX];
		if (tr_datasets_path(d, up->name, NULL, dpath, sizeof dpath) == 0)
			rmdir(dpath);
	}
	pthread_mutex_unlock(&d->lock);
	if (up->fd >= 0)
		close(up->fd);
	free(up);
}

void tr_datasets_upload_abort(tr_dataset_upload_t *up)
{
	if (!up)
		return;
	unlink(up->tmp);
	upload_free(up, 0);
}

int tr_datasets_upload_commit(tr_dataset_upload_t *up, struct tr_dataset_file *out, struct tr_error *err)
{
	tr_datasets_t *d = up->d;
	int rc = 0;
	if (up->failed)
		rc = tr_error_set(err, -EIO, 0, NULL, "%s/%s: the upload has failed", up->name, up->file);
	else if (up->declared >= 0 && up->written != up->declared)
		rc = tr_error_set(err, -EPROTO, 0, NULL, "%s/%s: %" PRId64 " of %" PRId64 " declared bytes came",
				  up->name, up->file, up->written, up->declared);
	else if (fsync(up->fd) < 0)
		rc = tr_error_set(err, errno == ENOSPC || errno == EDQUOT ? -ENOSPC : -EIO, 0, NULL,
				  "%s/%s: cannot sync: %s", up->name, up->file, strerror(errno));
	struct stat st;
	if (rc == 0 && fstat(up->fd, &st) < 0)
		rc = tr_error_set(err, -errno, 0, NULL, "%s/%s: %s", up->name, up->file, strerror(errno));
	if (rc < 0) {
		tr_datasets_upload_abort(up);
		return rc;
	}
	char hex[65], rec[PATH_MAX], fpath[PATH_MAX], dpath[PATH_MAX];
	tr_sha256_final_hex(&up->sha, hex);
	tr_datasets_path(d, up->name, up->file, fpath, sizeof fpath);
	tr_datasets_path(d, up->name, NULL, dpath, sizeof dpath);
	record_path(d, up->name, up->file, rec, sizeof rec);
	fchmod(up->fd, 0600);

	pthread_mutex_lock(&d->lock);
	/* What it replaces now (another upload may have committed since, or
	 * the file been deleted): the quota must hold with that. */
	int64_t replaced = replaced_now_locked(up);
	struct stat old;
	bool adds_file = lstat(fpath, &old) < 0;
	int64_t after = d->used - replaced + (d->reserved - up->reserved) + up->written;
	if (d->max_bytes > 0 && after > d->max_bytes)
		rc = tr_error_set(err, -EFBIG, 0, NULL,
				  "%s/%s: %" PRId64 " bytes no longer fit the datasets quota of %" PRId64
				  " bytes: the file it replaces changed while it was sent (datasets-max-bytes sets it)",
				  up->name, up->file, up->written, d->max_bytes);
	/* The record first: until the rename below it names an inode that is
	 * not FILE's yet, and a crash in between shows the checksum unknown. */
	if (rc == 0)
		rc = write_record(rec, hex, up->written, (uint64_t)st.st_ino, err);
	if (rc == 0 && rename(up->tmp, fpath) < 0)
		rc = tr_error_set(err, -errno, 0, NULL, "%s/%s: cannot rename into place: %s", up->name, up->file,
				  strerror(errno));
	if (rc == 0) {
		d->used -= replaced;
		d->files += adds_file;
		sync_dir(dpath);
	}
	pthread_mutex_unlock(&d->lock);
	if (rc < 0) {
		tr_datasets_upload_abort(up);
		return rc;
	}
	if (out) {
		memset(out, 0, sizeof *out);
		snprintf(out->name, sizeof out->name, "%s", up->name);
		snprintf(out->file, sizeof out->file, "%s", up->file);
		out->bytes = up->written;
		memcpy(out->sha256, hex, 65);
		out->modified = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9;
	}
	upload_free(up, up->written);
	return 0;
}

/* ---- listing and removal ---------------------------------------------------- */

static int cmp_files(const void *a, const void *b)
{
	const struct tr_dataset_file *x = a, *y = b;
	int c = strcmp(x->name, y->name);
	return c ? c : strcmp(x->file, y->file);
}

/* Fills out for NAME/FILE from st. */
static void fill_entry(const tr_datasets_t *d, const char *name, const char *file, const struct stat *st,
		       struct tr_dataset_file *out)
{
	memset(out, 0, sizeof *out);
	/* Both passed tr_datasets_check_name, so they fit; the precision
	 * says so to the compiler. */
	snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof out->name - 1, name);
	snprintf(out->file, sizeof out->file, "%.*s", (int)sizeof out->file - 1, file);
	out->bytes = st->st_size;
	out->modified = (double)st->st_mtim.tv_sec + st->st_mtim.tv_nsec * 1e-9;
	read_record(d, name, file, st, out);
}

int tr_datasets_list(tr_datasets_t *d, struct tr_dataset_file **files, size_t *count, struct tr_error *err)
{
	*files = NULL;
	*count = 0;
	struct tr_dataset_file *v = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	pthread_mutex_lock(&d->lock);
	DIR *top = opendir(d->dir);
	if (!top)
		rc = tr_error_set(err, -errno, 0, NULL, "%s: %s", d->dir, strerror(errno));
	struct dirent *e;
	while (rc == 0 && (e = readdir(top))) {
		if (tr_datasets_check_name("dataset name", e->d_name, NULL) < 0)
			continue;
		char dpath[PATH_MAX];
		if (tr_datasets_path(d, e->d_name, NULL, dpath, sizeof dpath) < 0)
			continue;
		DIR *sub = opendir(dpath);
		struct dirent *f;
		struct stat st;
		while (sub && rc == 0 && (f = readdir(sub))) {
			if (tr_datasets_check_name("file name", f->d_name, NULL) < 0 ||
			    fstatat(dirfd(sub), f->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
				continue;
			if (n == cap) {
				size_t ncap = cap ? 2 * cap : 16;
				void *nv = realloc(v, ncap * sizeof *v);
				if (!nv) {
					rc = tr_error_set(err, -ENOMEM, 0, NULL, "out of memory");
					break;
				}
				v = nv;
				cap = ncap;
			}
			fill_entry(d, e->d_name, f->d_name, &st, &v[n++]);
		}
		if (sub)
			closedir(sub);
	}
	if (top)
		closedir(top);
	pthread_mutex_unlock(&d->lock);
	if (rc < 0) {
		free(v);
		return rc;
	}
	if (n)
		qsort(v, n, sizeof *v, cmp_files);
	*files = v;
	*count = n;
	return 0;
}

int tr_datasets_stat(tr_datasets_t *d, const char *name, const char *file, struct tr_dataset_file *out,
		     struct tr_error *err)
{
	int rc = tr_datasets_check_name("dataset name", name, err);
	if (rc == 0)
		rc = tr_datasets_check_name("file name", file, err);
	if (rc < 0)
		return rc;
	char path[PATH_MAX];
	struct stat st;
	if (tr_datasets_path(d, name, file, path, sizeof path) < 0)
		return tr_error_set(err, -ENAMETOOLONG, 0, NULL, "%s/%s: the path is too long", name, file);
	pthread_mutex_lock(&d->lock);
	if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
		rc = tr_error_set(err, -ENOENT, 0, NULL, "no dataset file %s/%s", name, file);
	else
		fill_entry(d, name, file, &st, out);
	pthread_mutex_unlock(&d->lock);
	return rc;
}

/* Deletes NAME/FILE and its record (under d->lock); *freed += its size. */
static int remove_file_locked(tr_datasets_t *d, const char *name, const char *file, int64_t *freed,
			      struct tr_error *err)
{
	char path[PATH_MAX], rec[PATH_MAX];
	struct stat st;
	if (tr_datasets_path(d, name, file, path, sizeof path) < 0 || record_path(d, name, file, rec, sizeof rec) < 0)
		return tr_error_set(err, -ENAMETOOLONG, 0, NULL, "%s/%s: the path is too long", name, file);
	if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
		return tr_error_set(err, -ENOENT, 0, NULL, "no dataset file %s/%s", name, file);
	if (unlink(path) < 0)
		return tr_error_set(err, -errno, 0, NULL, "%s/%s: cannot delete: %s", name, file, strerror(errno));
	unlink(rec);
	d->used -= st.st_size;
	d->files--;
	*freed += st.st_size;
	return 0;
}

int tr_datasets_remove(tr_datasets_t *d, const char *name, const char *file, int64_t *freed, struct tr_error *err)
{
	int64_t got = 0;
	int rc = tr_datasets_check_name("dataset name", name, err);
	if (rc == 0 && file)
		rc = tr_datasets_check_name("file name", file, err);
	if (rc < 0)
		return rc;
	char dpath[PATH_MAX];
	if (tr_datasets_path(d, name, NULL, dpath, sizeof dpath) < 0)
		return tr_error_set(err, -ENAMETOOLONG, 0, NULL, "%s: the path is too long", name);
	pthread_mutex_lock(&d->lock);
	if (file) {
		rc = remove_file_locked(d, name, file, &got, err);
	} else {
		DIR *sub = opendir(dpath);
		if (!sub)
			rc = tr_error_set(err, -ENOENT, 0, NULL, "no dataset %s", name);
		struct dirent *f;
		while (sub && rc == 0 && (f = readdir(sub)))
			if (tr_datasets_check_name("file name", f->d_name, NULL) == 0) {
				int r = remove_file_locked(d, name, f->d_name, &got, err);
				if (r < 0 && r != -ENOENT)
					rc = r;
			}
		if (sub)
			closedir(sub);
	}
	if (rc == 0) {
		rmdir(dpath); /* when empty: an upload in progress keeps it */
		sync_dir(d->dir);
	}
	pthread_mutex_unlock(&d->lock);
	if (freed)
		*freed = got;
	return rc;
}
