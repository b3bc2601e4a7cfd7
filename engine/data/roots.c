/* Data roots and the confined open (see roots.h for the contract).
 *
 * openat2(RESOLVE_BENEATH) does the confinement in the kernel: every
 * component, symlink targets included, is resolved beneath the root's
 * descriptor, and a step out of it fails with EXDEV.  Kernels before 5.6
 * lack openat2 (ENOSYS, also seccomp filters that do not know it), and get
 * tr_data_open_walk instead: one O_NOFOLLOW open per component from the
 * root's descriptor, with symlinks read through the descriptor that was
 * checked and expanded by hand, and ".." taken from the walk's own stack
 * of directories rather than from the tree, which may be rearranged while
 * we walk it.  Both refuse absolute symlinks, as RESOLVE_BENEATH does.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/data/reader_internal.h"
#include "engine/data/roots.h"

#define MAX_ROOTS 64
#define MAX_WALK_DEPTH 128
#define MAX_SYMLINKS 40 /* as the kernel's path walk */

struct root {
	int fd;      /* O_PATH | O_DIRECTORY */
	char *real;  /* realpath, used to name files */
	char *given; /* as configured, made absolute: also accepted in absolute paths */
};

struct tr_data_roots {
	int n;
	struct root r[MAX_ROOTS];
};

static atomic_int force_walk, no_openat2;

void tr_data_open_force_walk(int on)
{
	atomic_store(&force_walk, on);
}

int tr_data_roots_create(const char *const *dirs, tr_data_roots_t **out, struct tr_error *err)
{
	tr_data_roots_t *r;
	char real[PATH_MAX], cwd[PATH_MAX];
	int ret;

	*out = NULL;
	if (!dirs || !dirs[0]) {
		tr_error_set(err, 0, 0, NULL, "no data roots");
		return -EINVAL;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		goto oom;
	for (; dirs[r->n]; r->n++) {
		const char *d = dirs[r->n];
		struct root *x;

		if (r->n == MAX_ROOTS) {
			tr_error_set(err, 0, 0, NULL, "more than %d data roots", MAX_ROOTS);
			ret = -E2BIG;
			goto fail;
		}
		x = &r->r[r->n];
		x->fd = open(d, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (x->fd < 0 || !realpath(d, real)) {
			ret = -errno;
			tr_error_set(err, 0, 0, NULL, "%s: %s", d, strerror(errno));
			goto fail;
		}
		x->real = strdup(real);
		if (d[0] == '/')
			x->given = strdup(d);
		else if (asprintf(&x->given, "%s/%s", getcwd(cwd, sizeof cwd) ? cwd : "", d) < 0)
			x->given = NULL;
		if (!x->real || !x->given)
			goto oom;
	}
	*out = r;
	return 0;
oom:
	tr_error_set(err, 0, 0, NULL, "out of memory");
	ret = -ENOMEM;
fail:
	if (r && r->n < MAX_ROOTS && r->r[r->n].fd >= 0)
		r->n++; /* destroy closes the one being set up too */
	tr_data_roots_destroy(r);
	return ret;
}

void tr_data_roots_destroy(tr_data_roots_t *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->n; i++) {
		if (r->r[i].fd >= 0)
			close(r->r[i].fd);
		free(r->r[i].real);
		free(r->r[i].given);
	}
	free(r);
}

void tr_data_roots_describe(const tr_data_roots_t *r, char *buf, size_t len)
{
	size_t n = 0;

	if (len == 0)
		return;
	buf[0] = '\0';
	for (int i = 0; r && i < r->n && n < len; i++) {
		int w = snprintf(buf + n, len - n, "%s%s", i ? ", " : "", r->r[i].real);

		if (w < 0)
			break;
		n += (size_t)w;
	}
}

/* ---- the O_NOFOLLOW walk ------------------------------------------------ */

int tr_data_open_walk(int root_fd, const char *rel, int flags)
{
	int stack[MAX_WALK_DEPTH];
	int depth = 0, links = 0, ret;
	char *rest, *p;

	if (rel[0] == '/')
		return -EXDEV;
	rest = strdup(rel);
	if (!rest)
		return -ENOMEM;
	stack[0] = root_fd;
	p = rest;
	for (;;) {
		char *comp, *next;
		int fd, last;
		struct stat st;

		while (*p == '/')
			p++;
		if (!*p) {
			/* The path names a directory ("", "sub/", ".."). */
			ret = -EISDIR;
			goto out;
		}
		comp = p;
		next = strchr(p, '/');
		if (next)
			*next++ = '\0';
		else
			next = p + strlen(p);
		while (*next == '/')
			next++;
		last = *next == '\0';
		p = next;
		if (strcmp(comp, ".") == 0)
			continue;
		if (strcmp(comp, "..") == 0) {
			if (depth == 0) {
				ret = -EXDEV;
				goto out;
			}
			close(stack[depth--]);
			continue;
		}
		if (last) {
			fd = openat(stack[depth], comp, flags | O_NOFOLLOW);
			if (fd >= 0) {
				ret = fd;
				goto out;
			}
			if (errno != ELOOP) {
				ret = -errno;
				goto out;
			}
			/* A symlink: expanded below. */
		}
		fd = openat(stack[depth], comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &st) < 0) {
			ret = -errno;
			if (fd >= 0)
				close(fd);
			goto out;
		}
		if (S_ISLNK(st.st_mode)) {
			char target[PATH_MAX];
			ssize_t n = readlinkat(fd, "", target, sizeof target - 1);
			char *joined;

			close(fd);
			if (n < 0 || ++links > MAX_SYMLINKS) {
				ret = n < 0 ? -errno : -ELOOP;
				goto out;
			}
			target[n] = '\0';
			if (target[0] == '/') {
				ret = -EXDEV;
				goto out;
			}
			if (asprintf(&joined, "%s/%s", target, p) < 0) {
				ret = -ENOMEM;
				goto out;
			}
			free(rest);
			rest = p = joined;
			continue;
		}
		if (last) {
			/* A symlink a moment ago and not now: open it again. */
			close(fd);
			if (++links > MAX_SYMLINKS) {
				ret = -ELOOP;
				goto out;
			}
			p = comp;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			close(fd);
			ret = -ENOTDIR;
			goto out;
		}
		if (depth + 1 == MAX_WALK_DEPTH) {
			close(fd);
			ret = -ENAMETOOLONG;
			goto out;
		}
		stack[++depth] = fd;
	}
out:
	while (depth > 0)
		close(stack[depth--]);
	free(rest);
	return ret;
}

/* ---- the open ------------------------------------------------------------ */

#define OPEN_FLAGS (O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
#define DIR_FLAGS (O_RDONLY | O_CLOEXEC | O_DIRECTORY)

static int open_beneath(int root_fd, const char *rel, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)flags,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};

	if (!atomic_load(&force_walk) && !atomic_load(&no_openat2)) {
		for (int tries = 0; tries < 8; tries++) {
			long fd = syscall(SYS_openat2, root_fd, rel, &how, sizeof how);

			if (fd >= 0)
				return (int)fd;
			/* EAGAIN: a rename raced with a ".." step; try again. */
			if (errno == EAGAIN)
				continue;
			if (errno != ENOSYS && errno != EPERM)
				return -errno;
			/* ENOSYS, or EPERM from a seccomp filter that predates it. */
			atomic_store(&no_openat2, 1);
			break;
		}
		if (!atomic_load(&no_openat2))
			return -EAGAIN;
	}
	/* The walk takes a path to something below the root, not the root. */
	if (strcmp(rel, ".") == 0) {
		int fd = openat(root_fd, ".", flags);

		return fd < 0 ? -errno : fd;
	}
	return tr_data_open_walk(root_fd, rel, flags);
}

/* Not found, or found only by leaving the root: the same answer. */
static int not_found(int rc)
{
	return rc == -ENOENT || rc == -EXDEV || rc == -ELOOP || rc == -ENOTDIR || rc == -EAGAIN;
}

static const char *kind_of(mode_t m)
{
	return S_ISDIR(m)                 ? "a directory"
	       : S_ISFIFO(m)              ? "a FIFO"
	       : S_ISSOCK(m)              ? "a socket"
	       : S_ISCHR(m) || S_ISBLK(m) ? "a device"
					  : "not a regular file";
}

/* Accepts fd when it is a regular file (a directory with want_dir), and
 * makes it blocking again: the O_NONBLOCK only kept the open itself from
 * waiting. */
static int accept_fd(int fd, const char *path, int want_dir, struct stat *st, struct tr_error *err)
{
	struct stat s;
	int fl;

	if (fstat(fd, &s) < 0) {
		int ret = -errno;

		tr_error_set(err, 0, 0, NULL, "'%s': %s", path, strerror(errno));
		return ret;
	}
	if (want_dir && !S_ISDIR(s.st_mode)) {
		tr_error_set(err, 0, 0, NULL, "'%s' is %s, not a directory", path,
			     S_ISREG(s.st_mode) ? "a file" : kind_of(s.st_mode));
		return -ENOTDIR;
	}
	if (!want_dir && !S_ISREG(s.st_mode)) {
		tr_error_set(err, 0, 0, NULL, "'%s' is %s, not a regular file", path, kind_of(s.st_mode));
		return -EINVAL;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		int ret = -errno;

		tr_error_set(err, 0, 0, NULL, "'%s': %s", path, strerror(errno));
		return ret;
	}
	if (st)
		*st = s;
	return 0;
}

/* The part of absolute `path` below `root` (one spelling of it), or NULL. */
static const char *below(const char *root, const char *path)
{
	size_t n = strlen(root);

	while (n > 1 && root[n - 1] == '/')
		n--;
	if (n == 1 && root[0] == '/')
		n = 0;
	else if (strncmp(root, path, n) != 0 || (path[n] != '/' && path[n] != '\0'))
		return NULL;
	path += n;
	while (*path == '/')
		path++;
	return *path ? path : ".";
}

static int open_unconfined(const char *path, int want_dir, struct stat *st, char *shown, size_t shownlen,
			   struct tr_error *err)
{
	int fd = open(path, want_dir ? DIR_FLAGS : OPEN_FLAGS), ret;

	if (fd < 0) {
		char cwd[PATH_MAX];

		ret = -errno;
		if (path[0] != '/' && getcwd(cwd, sizeof cwd))
			tr_error_set(err, 0, 0, NULL,
				     "'%s': %s (relative paths resolve against the working directory, %s)", path,
				     strerror(errno), cwd);
		else
			tr_error_set(err, 0, 0, NULL, "'%s': %s", path, strerror(errno));
		return ret;
	}
	ret = accept_fd(fd, path, want_dir, st, err);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	if (shown)
		snprintf(shown, shownlen, "%s", path);
	return fd;
}

static int open_path(const tr_data_roots_t *roots, const char *path, int want_dir, struct stat *st, char *shown,
		     size_t shownlen, struct tr_error *err)
{
	int first_err = 0;

	if (!path || !*path) {
		tr_error_set(err, 0, 0, NULL, "empty path");
		return -EINVAL;
	}
	if (!roots)
		return open_unconfined(path, want_dir, st, shown, shownlen, err);
	for (int i = 0; i < roots->n; i++) {
		const struct root *x = &roots->r[i];
		const char *rel = path;
		int fd, ret;

		if (path[0] == '/') {
			rel = below(x->real, path);
			if (!rel)
				rel = below(x->given, path);
			if (!rel)
				continue;
		}
		fd = open_beneath(x->fd, rel, want_dir ? DIR_FLAGS : OPEN_FLAGS);
		if (fd < 0) {
			if (!not_found(fd) && !first_err) {
				first_err = fd;
				tr_error_set(err, 0, 0, NULL, "'%s': %s", path,
					     fd == -EISDIR ? "is a directory, not a regular file" : strerror(-fd));
			}
			continue;
		}
		ret = accept_fd(fd, path, want_dir, st, err);
		if (ret < 0) {
			close(fd);
			if (!first_err)
				first_err = ret;
			continue;
		}
		if (shown) {
			if (strcmp(rel, ".") == 0)
				snprintf(shown, shownlen, "%s", x->real);
			else
				snprintf(shown, shownlen, "%s%s%s", x->real, strcmp(x->real, "/") ? "/" : "", rel);
		}
		return fd;
	}
	if (first_err)
		return first_err == -EISDIR ? -EINVAL : first_err;
	{
		char list[1024];

		tr_data_roots_describe(roots, list, sizeof list);
		tr_error_set(err, 0, 0, NULL, "'%s' is not a %s in the data roots (%s)", path,
			     want_dir ? "directory" : "file", list);
	}
	return -ENOENT;
}

int tr_data_open(const tr_data_roots_t *roots, const char *path, struct stat *st, char *shown, size_t shownlen,
		 struct tr_error *err)
{
	return open_path(roots, path, 0, st, shown, shownlen, err);
}

int tr_data_open_dir(const tr_data_roots_t *roots, const char *path, char *shown, size_t shownlen, struct tr_error *err)
{
	char trimmed[PATH_MAX];
	size_t n;

	if (!path || !*path) {
		tr_error_set(err, 0, 0, NULL, "empty path");
		return -EINVAL;
	}
	/* "images/" names the same directory; the walk wants no trailing '/'. */
	n = strlen(path);
	if (n >= sizeof trimmed) {
		tr_error_set(err, 0, 0, NULL, "'%s': %s", path, strerror(ENAMETOOLONG));
		return -ENAMETOOLONG;
	}
	memcpy(trimmed, path, n + 1);
	while (n > 1 && trimmed[n - 1] == '/')
		trimmed[--n] = '\0';
	return open_path(roots, trimmed, 1, NULL, shown, shownlen, err);
}

int tr_data_open_in(int dir_fd, const char *name, int want_dir, struct stat *st, struct tr_error *err)
{
	int fd, ret;

	/* One component, no symlink: nothing outside dir_fd can be reached. */
	if (!*name || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
		tr_error_set(err, 0, 0, NULL, "'%s': not a plain file name", name);
		return -EINVAL;
	}
	fd = openat(dir_fd, name, (want_dir ? DIR_FLAGS : OPEN_FLAGS) | O_NOFOLLOW);
	if (fd < 0) {
		ret = -errno;
		tr_error_set(err, 0, 0, NULL, "'%s': %s", name,
			     errno == ELOOP ? "a symbolic link (not followed inside a data directory)"
					    : strerror(errno));
		return ret;
	}
	ret = accept_fd(fd, name, want_dir, st, err);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	return fd;
}
