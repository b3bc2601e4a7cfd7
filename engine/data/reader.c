/* Reader dispatch, slices and the guarded file mapping.
 *
 * tr_reader_open picks the format's opener and opens its files through
 * tr_data_open, so the format files only ever see a descriptor and the
 * name to give it in messages.  Slices are the one reader type that owns
 * no data: they borrow a base reader and shift indices, which is all that
 * validation_split needs.  The helpers every reader shares (the error
 * formatter and the guarded read-only mapping, see reader_internal.h)
 * live here too.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/data/reader_internal.h"

void tr_data_sanitize(char *s)
{
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			*s = '?';
}

/* ---- guarded mappings ---------------------------------------------------- */

/* The calling thread's guard: where to jump on a fault in one of its maps,
 * and which map faulted.  Initial-exec TLS (the engine is linked into the
 * executable), so the handler may read it. */
static __thread __attribute__((tls_model("initial-exec"))) struct {
	sigjmp_buf *jb;
	const struct tr_data_map *const *maps;
	int n;
	const struct tr_data_map *faulted;
} guard;

static struct sigaction old_sigbus;
static pthread_once_t sigbus_once = PTHREAD_ONCE_INIT;

/* A SIGBUS in a guarded read leaves the read; any other goes where it went
 * before (the previous handler, or the default action: the faulting access
 * repeats and ends the process as it would have). */
static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	const unsigned char *a = si->si_addr;

	for (int i = 0; guard.jb && i < guard.n; i++) {
		const struct tr_data_map *m = guard.maps[i];

		if (m->base && a >= m->base && a < m->base + m->len) {
			guard.faulted = m;
			siglongjmp(*guard.jb, 1);
		}
	}
	if ((old_sigbus.sa_flags & SA_SIGINFO) && old_sigbus.sa_sigaction) {
		old_sigbus.sa_sigaction(sig, si, uc);
	} else if (!(old_sigbus.sa_flags & SA_SIGINFO) && old_sigbus.sa_handler != SIG_DFL &&
		   old_sigbus.sa_handler != SIG_IGN) {
		old_sigbus.sa_handler(sig);
	} else {
		struct sigaction dfl = {.sa_handler = SIG_DFL};

		sigaction(SIGBUS, &dfl, NULL);
	}
}

static void install_sigbus(void)
{
	/* SA_NODEFER: sigsetjmp(jb, 0) saves no signal mask, so leaving the
	 * handler by siglongjmp restores none and SIGBUS must not be blocked
	 * inside it.  For the same reason no thread may block SIGBUS (a
	 * blocked synchronous SIGBUS kills the process whatever the handler). */
	struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK};

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &old_sigbus);
}

void tr_data_guard_begin(sigjmp_buf *jb, const struct tr_data_map *const *maps, int n)
{
	guard.maps = maps;
	guard.n = n;
	guard.faulted = NULL;
	atomic_signal_fence(memory_order_seq_cst);
	guard.jb = jb;
	atomic_signal_fence(memory_order_seq_cst);
}

void tr_data_guard_end(void)
{
	atomic_signal_fence(memory_order_seq_cst);
	guard.jb = NULL;
	atomic_signal_fence(memory_order_seq_cst);
}

static int changed(const struct tr_data_map *m, const char *how, struct tr_error *err)
{
	struct stat st;

	if (fstat(m->fd, &st) == 0 && (size_t)st.st_size != m->len)
		tr_error_set(err, 0, 0, NULL,
			     "%s: the file changed while the job was reading it (%s; now %lld bytes, %zu when the "
			     "job opened it): a data file must not be modified while a job uses it",
			     m->name, how, (long long)st.st_size, m->len);
	else
		tr_error_set(err, 0, 0, NULL,
			     "%s: the file changed while the job was reading it (%s): a data file must not be "
			     "modified while a job uses it",
			     m->name, how);
	return -ESTALE;
}

int tr_data_guard_failed(struct tr_error *err)
{
	const struct tr_data_map *m = guard.faulted;
	sigset_t bus;

	tr_data_guard_end();
	/* SA_NODEFER should have kept SIGBUS unblocked; a runtime that wraps
	 * handlers (ThreadSanitizer) may not pass it on, and a blocked SIGBUS
	 * at the next fault would end the process.  Rare path: cheap. */
	sigemptyset(&bus);
	sigaddset(&bus, SIGBUS);
	pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
	if (!m) {
		tr_error_set(err, 0, 0, NULL, "a data file changed while the job was reading it");
		return -ESTALE;
	}
	return changed(m, "truncated", err);
}

int tr_data_map_open(int fd, const char *name, size_t min_size, const char *kind, struct tr_data_map *m,
		     struct tr_error *err)
{
	struct stat st;
	void *p;
	int ret;

	memset(m, 0, sizeof(*m));
	m->fd = -1;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", name, strerror(errno));
		close(fd);
		return ret;
	}
	if (st.st_size < (off_t)min_size) {
		tr_error_set(err, 0, 0, NULL, "%s: not %s (too short)", name, kind);
		close(fd);
		return -EINVAL;
	}
	pthread_once(&sigbus_once, install_sigbus);
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED) {
		ret = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: mmap: %s", name, strerror(errno));
		close(fd);
		return ret;
	}
	m->base = p;
	m->len = (size_t)st.st_size;
	m->fd = fd;
	m->mtime = st.st_mtim;
	snprintf(m->name, sizeof(m->name), "%s", name);
	return 0;
}

void tr_data_map_release(struct tr_data_map *m)
{
	if (m->base) {
		munmap((void *)m->base, m->len);
		close(m->fd);
	}
	m->base = NULL;
	m->fd = -1;
}

int tr_data_map_check(const struct tr_data_map *m, struct tr_error *err)
{
	struct stat st;

	if (!m->base)
		return 0;
	if (fstat(m->fd, &st) < 0) {
		int ret = -errno;

		tr_error_set(err, 0, 0, NULL, "%s: %s", m->name, strerror(errno));
		return ret;
	}
	if ((size_t)st.st_size != m->len)
		return changed(m, "its size changed", err);
	if (st.st_mtim.tv_sec != m->mtime.tv_sec || st.st_mtim.tv_nsec != m->mtime.tv_nsec)
		return changed(m, "it was written to", err);
	return 0;
}

int tr_data_check_due(_Atomic int64_t *last)
{
	struct timespec ts;
	int64_t now, prev;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	prev = atomic_load_explicit(last, memory_order_relaxed);
	if (prev < 0)
		return 1; /* a check failed: every later one looks again */
	if (prev && now - prev < (int64_t)TR_DATA_CHECK_MS * 1000000)
		return 0;
	/* One of the threads that find it due does the check. */
	return atomic_compare_exchange_strong(last, &prev, now);
}

/* ---- opening ---------------------------------------------------------------- */

/* Opens one of the source's files; *fd and name (the file's name for
 * messages) are set on success.  `what` names a missing path. */
static int open_one(const tr_data_roots_t *roots, const char *path, const char *what, int *fd, char *name,
		    size_t namelen, struct tr_error *err)
{
	if (!path || !*path) {
		tr_error_set(err, 0, 0, NULL, "data source has no %s path", what);
		return -EINVAL;
	}
	*fd = tr_data_open(roots, path, NULL, name, namelen, err);
	return *fd < 0 ? *fd : 0;
}

/* patches: "path" (b stays -1), or "input_path" and "response_path". */
static int open_patch_dirs(const struct tr_source_spec *src, const tr_data_roots_t *roots, int *a, char *a_name, int *b,
			   char *b_name, struct tr_error *err)
{
	const char *first = src->path ? src->path : src->input_path;

	if (!first || !*first) {
		tr_error_set(err, 0, 0, NULL, "data source has no patches path");
		return -EINVAL;
	}
	*a = tr_data_open_dir(roots, first, a_name, PATH_MAX, err);
	if (*a < 0)
		return *a;
	if (src->path)
		return 0;
	if (!src->response_path || !*src->response_path) {
		close(*a);
		tr_error_set(err, 0, 0, NULL, "data source has no patches response_path");
		return -EINVAL;
	}
	*b = tr_data_open_dir(roots, src->response_path, b_name, PATH_MAX, err);
	if (*b < 0) {
		close(*a);
		return *b;
	}
	return 0;
}

int tr_reader_open(const struct tr_source_spec *src, uint64_t job_seed, const tr_data_roots_t *roots,
		   const atomic_bool *cancel, tr_reader_t **out, struct tr_error *err)
{
	char a_name[PATH_MAX], b_name[PATH_MAX];
	int a = -1, b = -1;
	int ret;

	if (!src || !out) {
		tr_error_set(err, 0, 0, NULL, "no data source");
		return -EINVAL;
	}
	*out = NULL;
	if (cancel && atomic_load(cancel)) {
		tr_error_set(err, 0, 0, NULL, "cancelled");
		return -ECANCELED;
	}
	switch (src->format) {
	case TR_DATA_CSV:
		ret = open_one(roots, src->path, "csv", &a, a_name, sizeof a_name, err);
		if (ret == 0)
			ret = tr_csv_open(src, a, a_name, cancel, out, err);
		break;
	case TR_DATA_NPY:
		ret = open_one(roots, src->x_path, "npy x", &a, a_name, sizeof a_name, err);
		if (ret == 0 && !src->unlabeled)
			ret = open_one(roots, src->y_path, "npy y", &b, b_name, sizeof b_name, err);
		if (ret == 0)
			ret = tr_npy_open(a, a_name, b, b_name, out, err);
		else if (a >= 0)
			close(a);
		break;
	case TR_DATA_IDX:
		ret = open_one(roots, src->images_path, "idx images", &a, a_name, sizeof a_name, err);
		if (ret == 0 && !src->unlabeled)
			ret = open_one(roots, src->labels_path, "idx labels", &b, b_name, sizeof b_name, err);
		if (ret == 0)
			ret = tr_idx_open(a, a_name, b, b_name, out, err);
		else if (a >= 0)
			close(a);
		break;
	case TR_DATA_IMAGES:
		a = tr_data_open_dir(roots, src->path, a_name, sizeof a_name, err);
		ret = a < 0 ? a : tr_images_open(src, a, a_name, cancel, out, err);
		break;
	case TR_DATA_PATCHES:
		ret = open_patch_dirs(src, roots, &a, a_name, &b, b_name, err);
		if (ret == 0)
			ret = tr_patches_open(src, a, a_name, b, b_name, cancel, out, err);
		break;
	case TR_DATA_SYNTHETIC:
		(void)job_seed; /* the spec parser fills data_seed (default: the job seed) */
		ret = tr_synthetic_open(src, src->data_seed, out, err);
		break;
	default:
		tr_error_set(err, 0, 0, NULL, "unknown data format %d", (int)src->format);
		ret = -EINVAL;
		break;
	}
	return ret;
}

int tr_reader_check_shape(const tr_reader_t *r, const int shape[3], struct tr_error *err)
{
	const int *have = r->info.shape;
	int64_t want = (int64_t)shape[0] * shape[1] * shape[2];

	if (have[0]) {
		if (have[0] == shape[0] && have[1] == shape[1] && have[2] == shape[2])
			return 0;
		tr_error_set(err, 0, 0, "/model/inputs",
			     "/model/inputs: [%d, %d, %d] does not match the [%d, %d, %d] images of %s", shape[0],
			     shape[1], shape[2], have[0], have[1], have[2], r->name);
		return -EINVAL;
	}
	if (want == r->info.features)
		return 0;
	tr_error_set(err, 0, 0, "/model/inputs",
		     "/model/inputs: [%d, %d, %d] (%lld values) does not match the %d features of %s", shape[0],
		     shape[1], shape[2], (long long)want, r->info.features, r->name);
	return -EINVAL;
}

void tr_reader_destroy(tr_reader_t *r)
{
	if (r)
		r->i->destroy(r);
}

struct slice {
	tr_reader_t base;
	tr_reader_t *src;
	int64_t begin;
};

static int slice_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct slice *s = (struct slice *)r;

	if (index < 0 || index >= r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld out of range (slice of %lld samples)", r->name,
			     (long long)index, (long long)r->info.samples);
		return -ERANGE;
	}
	return tr_reader_get(s->src, s->begin + index, x, y, err);
}

static int slice_get_epoch(tr_reader_t *r, int64_t index, int64_t epoch, float *x, float *y, struct tr_error *err)
{
	struct slice *s = (struct slice *)r;

	if (index < 0 || index >= r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld out of range (slice of %lld samples)", r->name,
			     (long long)index, (long long)r->info.samples);
		return -ERANGE;
	}
	return tr_reader_get_epoch(s->src, s->begin + index, epoch, x, y, err);
}

static void slice_destroy(tr_reader_t *r)
{
	free(r);
}

static int slice_check(tr_reader_t *r, struct tr_error *err)
{
	return tr_reader_check(((struct slice *)r)->src, err);
}

static int slice_labels(tr_reader_t *r, int64_t begin, int64_t count, float *y, struct tr_error *err)
{
	struct slice *s = (struct slice *)r;

	if (begin < 0 || count < 0 || begin + count > r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: samples %lld+%lld out of range (slice of %lld samples)", r->name,
			     (long long)begin, (long long)count, (long long)r->info.samples);
		return -ERANGE;
	}
	return s->src->i->labels(s->src, s->begin + begin, count, y, err);
}

static void slice_where(tr_reader_t *r, int64_t index, char *buf, size_t len)
{
	struct slice *s = (struct slice *)r;

	s->src->i->where(s->src, s->begin + index, buf, len);
}

/* Class names are the whole data set's (validation_split slices the
 * training reader). */
static const char *slice_class_name(tr_reader_t *r, int cls)
{
	tr_reader_t *src = ((struct slice *)r)->src;

	return src->i->class_name ? src->i->class_name(src, cls) : NULL;
}

static const struct tr_reader_i slice_i = {
	.get = slice_get,
	.destroy = slice_destroy,
	.check = slice_check,
	.labels = slice_labels,
	.where = slice_where,
	.get_epoch = slice_get_epoch,
	.class_name = slice_class_name,
};

/* A slice of a reader that cannot list its labels cannot either. */
static const struct tr_reader_i slice_nolabels_i = {
	.get = slice_get,
	.destroy = slice_destroy,
	.check = slice_check,
	.get_epoch = slice_get_epoch,
	.class_name = slice_class_name,
};

tr_reader_t *tr_reader_slice(tr_reader_t *base, int64_t begin, int64_t end)
{
	struct slice *s;

	if (!base || begin < 0 || end < begin || end > base->info.samples)
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->base.i = base->i->labels && base->i->where ? &slice_i : &slice_nolabels_i;
	s->base.info = base->info;
	s->base.info.samples = end - begin;
	memcpy(s->base.name, base->name, sizeof(s->base.name));
	s->src = base;
	s->begin = begin;
	return &s->base;
}
