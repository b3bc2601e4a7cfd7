/* Data-root confinement at open time.
 *
 * The daemon resolves a job's data paths against its data roots when the
 * job is submitted (daemon/paths.c), but the loaders open the files later,
 * when the job starts: a directory swapped for a symlink in between would
 * lead the open outside the roots.  So every data file is checked again
 * on the descriptor itself, after the open: /proc/self/fd names the file
 * that was actually opened, whatever symlinks the path went through, and
 * nothing can change that afterwards.  Without roots (trainerd run) there
 * is nothing to check.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data/reader_internal.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char **roots; /* NULL-terminated absolute, symlink-free directories */

int tr_data_confine(const char *const *dirs)
{
	char **copy = NULL;
	size_t n = 0;

	while (dirs && dirs[n])
		n++;
	if (n) {
		copy = calloc(n + 1, sizeof(*copy));
		if (!copy)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			if (!(copy[i] = strdup(dirs[i]))) {
				while (i--)
					free(copy[i]);
				free(copy);
				return -ENOMEM;
			}
		}
	}
	pthread_mutex_lock(&lock);
	char **old = roots;
	roots = copy;
	pthread_mutex_unlock(&lock);
	for (size_t i = 0; old && old[i]; i++)
		free(old[i]);
	free(old);
	return 0;
}

static int inside(const char *root, const char *path)
{
	size_t n = strlen(root);

	if (strcmp(root, "/") == 0)
		return 1;
	return strncmp(root, path, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

int tr_data_open(const char *path, char *err, size_t errlen)
{
	char link[64], real[PATH_MAX];
	int fd = open(path, O_RDONLY | O_CLOEXEC), ok = 0, ret;
	ssize_t n;

	if (fd < 0) {
		ret = -errno;
		tr_data_errorf(err, errlen, "%s: %s", path, strerror(errno));
		return ret;
	}
	pthread_mutex_lock(&lock);
	if (!roots) {
		pthread_mutex_unlock(&lock);
		return fd;
	}
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	n = readlink(link, real, sizeof real - 1);
	if (n > 0) {
		real[n] = '\0';
		for (size_t i = 0; roots[i] && !ok; i++)
			ok = inside(roots[i], real);
	}
	pthread_mutex_unlock(&lock);
	if (n <= 0) {
		/* Without /proc the check cannot be made: fail closed. */
		tr_data_errorf(err, errlen, "%s: cannot check that it is inside the data roots (%s)", path,
			       n < 0 ? strerror(errno) : "empty link");
		close(fd);
		return -EACCES;
	}
	if (!ok) {
		tr_data_errorf(err, errlen, "%s: is outside the daemon's data roots (it resolves to %s now)", path,
			       real);
		close(fd);
		return -EACCES;
	}
	return fd;
}
