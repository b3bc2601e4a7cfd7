/* The state directory's checks and lock (daemon/state_dir.h). */
#include "daemon/state_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_NAME "trainerd.lock"

/* Nobody but this user may write there: anyone else could plant a link
 * where the daemon creates or deletes files. */
static int check_owner_mode(const char *path, int fd, struct tr_error *err)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return tr_error_set(err, -errno, 0, NULL, "--state-dir %s: %s", path, strerror(errno));
	if (st.st_uid != geteuid())
		return tr_error_set(err, -EPERM, 0, NULL,
				    "--state-dir %s is owned by uid %u, not by the daemon's user (uid %u): other "
				    "users must not control where the daemon writes; chown %u %s, or use a directory "
				    "of its own",
				    path, (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)geteuid(), path);
	if (st.st_mode & (S_IWGRP | S_IWOTH))
		return tr_error_set(err, -EPERM, 0, NULL,
				    "--state-dir %s: mode %04o lets group or others write in it, and so plant links "
				    "the daemon would follow; chmod go-w %s",
				    path, (unsigned)(st.st_mode & 07777), path);
	return 0;
}

/* The pid the holder wrote, for the message; 0 when unreadable. */
static long lock_holder(int fd)
{
	char buf[32] = "";
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);

	if (n <= 0)
		return 0;
	buf[n] = '\0';
	return strtol(buf, NULL, 10);
}

static int take_lock(const char *path, struct tr_state_dir *sd, struct tr_error *err)
{
	char pid[32];
	int fd = openat(sd->dir_fd, LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0)
		return tr_error_set(err, -errno, 0, NULL, "--state-dir %s: cannot open %s: %s", path, LOCK_NAME,
				    strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		long holder = e == EWOULDBLOCK ? lock_holder(fd) : 0;

		close(fd);
		if (e != EWOULDBLOCK)
			return tr_error_set(err, -e, 0, NULL, "--state-dir %s: cannot lock %s: %s", path, LOCK_NAME,
					    strerror(e));
		if (holder > 0)
			return tr_error_set(err, -EBUSY, 0, NULL,
					    "--state-dir %s is in use by another trainerd (pid %ld); two daemons on "
					    "one state directory would run the same jobs twice",
					    path, holder);
		return tr_error_set(err, -EBUSY, 0, NULL, "--state-dir %s is in use by another trainerd", path);
	}
	int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
		int e = errno;
		close(fd);
		return tr_error_set(err, -e, 0, NULL, "--state-dir %s: cannot write %s: %s", path, LOCK_NAME,
				    strerror(e));
	}
	sd->lock_fd = fd;
	return 0;
}

int tr_state_dir_open(const char *path, struct tr_state_dir *sd, struct tr_error *err)
{
	int rc;

	sd->dir_fd = sd->lock_fd = -1;
	if (mkdir(path, 0750) < 0 && errno != EEXIST)
		return tr_error_set(err, -errno, 0, NULL, "--state-dir %s: %s", path, strerror(errno));
	sd->dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sd->dir_fd < 0)
		return tr_error_set(err, -errno, 0, NULL, "--state-dir %s: %s", path, strerror(errno));
	rc = check_owner_mode(path, sd->dir_fd, err);
	if (rc == 0)
		rc = take_lock(path, sd, err);
	if (rc < 0)
		tr_state_dir_close(sd);
	return rc;
}

void tr_state_dir_close(struct tr_state_dir *sd)
{
	/* The lock goes with its descriptor; the file stays (deleting it
	 * would race a daemon starting now). */
	if (sd->lock_fd >= 0)
		close(sd->lock_fd);
	if (sd->dir_fd >= 0)
		close(sd->dir_fd);
	sd->dir_fd = sd->lock_fd = -1;
}

int tr_state_dir_write_file(const struct tr_state_dir *sd, const char *name, const char *text)
{
	char tmp[256];
	size_t len = strlen(text);
	int fd, rc = 0;

	snprintf(tmp, sizeof tmp, "%s.tmp", name);
	if (unlinkat(sd->dir_fd, tmp, 0) < 0 && errno != ENOENT)
		return -errno;
	fd = openat(sd->dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (write(fd, text, len) != (ssize_t)len)
		rc = errno ? -errno : -EIO;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && renameat(sd->dir_fd, tmp, sd->dir_fd, name) < 0)
		rc = -errno;
	if (rc < 0)
		unlinkat(sd->dir_fd, tmp, 0);
	return rc;
}
