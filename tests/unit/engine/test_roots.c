/* Tests for the confined open of data files (engine/data/roots.c): every
 * way out of a root ("..", absolute and relative symlinks, symlinked
 * directories, absolute paths) fails with the same answer whether the
 * target exists or not, symlinks that stay inside work, only regular files
 * open, and the O_NOFOLLOW walk used without openat2 agrees with openat2
 * on every case.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/data/roots.h"

static char top[256], root[300], outside[300];
static struct tr_error err;
static tr_data_roots_t *roots;

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	fclose(f);
}

static void at(char *buf, size_t len, const char *dir, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

/* top/root: the data root; top/outside: a secret next to it.
 *   root/good.csv, root/sub/inner.csv
 *   root/in_link -> sub/inner.csv         (stays inside)
 *   root/in_dir -> sub                    (stays inside)
 *   root/up_link -> ../outside/secret.csv (climbs out)
 *   root/abs_link -> <abs>/root/good.csv  (absolute: refused even inside)
 *   root/out_dir -> ../outside            (a directory outside)
 *   root/loop -> loop
 *   root/fifo, root/sub (a directory) */
static void setup(void)
{
	char p[600], t[600];
	snprintf(top, sizeof top, "%s/tr_roots_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	cr_assert_not_null(mkdtemp(top));
	at(root, sizeof root, top, "root");
	at(outside, sizeof outside, top, "outside");
	cr_assert_eq(mkdir(root, 0700), 0);
	cr_assert_eq(mkdir(outside, 0700), 0);
	at(p, sizeof p, outside, "secret.csv");
	put(p, "1,2\n");
	at(p, sizeof p, root, "good.csv");
	put(p, "3,4\n");
	at(p, sizeof p, root, "sub");
	cr_assert_eq(mkdir(p, 0700), 0);
	at(p, sizeof p, root, "sub/inner.csv");
	put(p, "5,6\n");
	struct {
		const char *name, *target;
	} links[] = {
		{"in_link", "sub/inner.csv"}, {"in_dir", "sub"}, {"up_link", "../outside/secret.csv"},
		{"out_dir", "../outside"},    {"loop", "loop"},
	};
	for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
		at(p, sizeof p, root, links[i].name);
		cr_assert_eq(symlink(links[i].target, p), 0, "%s", p);
	}
	at(p, sizeof p, root, "abs_link");
	at(t, sizeof t, root, "good.csv");
	cr_assert_eq(symlink(t, p), 0);
	at(p, sizeof p, root, "fifo");
	cr_assert_eq(mkfifo(p, 0600), 0);
	const char *dirs[] = {root, NULL};
	cr_assert_eq(tr_data_roots_create(dirs, &roots, &err), 0, "%s", err.message);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void teardown(void)
{
	tr_data_roots_destroy(roots);
	roots = NULL;
	tr_data_open_force_walk(0);
	nftw(top, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(roots, .init = setup, .fini = teardown, .timeout = 30);

/* Opens path beneath the roots; returns the descriptor or error code. */
static int try_open(const char *path, char *shown, size_t shownlen)
{
	err.message[0] = 0;
	int fd = tr_data_open(roots, path, NULL, shown, shownlen, &err);
	if (fd >= 0)
		cr_assert_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "O_NONBLOCK left on");
	return fd;
}

static void read_is(int fd, const char *want)
{
	char buf[64] = "";
	cr_assert_gt(read(fd, buf, sizeof buf - 1), 0);
	cr_assert_str_eq(buf, want);
	close(fd);
}

static void check_cases(void)
{
	char shown[1024], p[600], want[600];

	read_is(try_open("good.csv", shown, sizeof shown), "3,4\n");
	at(want, sizeof want, root, "good.csv");
	cr_assert_str_eq(shown, want);
	read_is(try_open("sub/inner.csv", NULL, 0), "5,6\n");
	read_is(try_open("./sub/../good.csv", NULL, 0), "3,4\n");
	/* Symlinks that stay inside are fine, files and directories alike. */
	read_is(try_open("in_link", NULL, 0), "5,6\n");
	read_is(try_open("in_dir/inner.csv", NULL, 0), "5,6\n");
	/* An absolute path inside the root, in its real spelling. */
	at(p, sizeof p, root, "sub/inner.csv");
	read_is(try_open(p, shown, sizeof shown), "5,6\n");
	cr_assert_str_eq(shown, p);

	/* Every way out gives -ENOENT and the same words as a missing file. */
	const char *out[] = {
		"../outside/secret.csv",        "up_link",     "out_dir/secret.csv",     "abs_link",   "loop",
		"sub/../../outside/secret.csv", "missing.csv", "../outside/missing.csv", "good.csv/x",
	};
	for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) {
		cr_assert_eq(try_open(out[i], NULL, 0), -ENOENT, "%s: %s", out[i], err.message);
		char expect[1100];
		snprintf(expect, sizeof expect, "'%s' is not a file in the data roots (", out[i]);
		cr_assert(strstr(err.message, expect) && strstr(err.message, root), "%s: %s", out[i], err.message);
	}
	/* Absolute paths outside the roots: existing and missing alike. */
	at(p, sizeof p, outside, "secret.csv");
	cr_assert_eq(try_open(p, NULL, 0), -ENOENT, "%s", err.message);
	char existing[1100];
	snprintf(existing, sizeof existing, "%s", strstr(err.message, "' is not"));
	at(p, sizeof p, outside, "nothing.csv");
	cr_assert_eq(try_open(p, NULL, 0), -ENOENT, "%s", err.message);
	cr_assert_str_eq(strstr(err.message, "' is not"), existing);
	at(p, sizeof p, root, "../outside/secret.csv");
	cr_assert_eq(try_open(p, NULL, 0), -ENOENT, "%s", err.message);

	/* Only regular files. */
	cr_assert_eq(try_open("fifo", NULL, 0), -EINVAL);
	cr_assert(strstr(err.message, "'fifo' is a FIFO, not a regular file"), "%s", err.message);
	cr_assert_eq(try_open("sub", NULL, 0), -EINVAL);
	cr_assert(strstr(err.message, "directory"), "%s", err.message);
	cr_assert_eq(try_open(root, NULL, 0), -EINVAL, "%s", err.message);
}

Test(roots, openat2_confines_and_accepts_only_regular_files)
{
	check_cases();
}

Test(roots, nofollow_walk_agrees_with_openat2)
{
	tr_data_open_force_walk(1);
	check_cases();
}

Test(roots, walk_refuses_every_escape_directly)
{
	int rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	cr_assert_geq(rfd, 0);
	int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
	cr_assert_eq(tr_data_open_walk(rfd, "..", flags), -EXDEV);
	cr_assert_eq(tr_data_open_walk(rfd, "../outside/secret.csv", flags), -EXDEV);
	cr_assert_eq(tr_data_open_walk(rfd, "up_link", flags), -EXDEV);
	cr_assert_eq(tr_data_open_walk(rfd, "out_dir/secret.csv", flags), -EXDEV);
	cr_assert_eq(tr_data_open_walk(rfd, "abs_link", flags), -EXDEV);
	cr_assert_eq(tr_data_open_walk(rfd, "/etc/passwd", flags), -EXDEV);
	cr_assert_eq(tr_data_open_walk(rfd, "loop", flags), -ELOOP);
	cr_assert_eq(tr_data_open_walk(rfd, "missing", flags), -ENOENT);
	int fd = tr_data_open_walk(rfd, "in_dir/../in_link", flags);
	cr_assert_geq(fd, 0);
	read_is(fd, "5,6\n");
	close(rfd);
}

Test(roots, unconfined_opens_as_written_with_the_same_file_checks)
{
	char p[600];
	at(p, sizeof p, outside, "secret.csv");
	int fd = tr_data_open(NULL, p, NULL, NULL, 0, &err);
	read_is(fd, "1,2\n");
	at(p, sizeof p, root, "fifo");
	cr_assert_eq(tr_data_open(NULL, p, NULL, NULL, 0, &err), -EINVAL);
	cr_assert_eq(tr_data_open(NULL, "no-such-file.csv", NULL, NULL, 0, &err), -ENOENT);
	cr_assert(strstr(err.message, "working directory"), "%s", err.message);
}

Test(roots, several_roots_and_their_description)
{
	char p[700], list[2048];
	const char *dirs[] = {outside, root, NULL};
	tr_data_roots_t *two;
	cr_assert_eq(tr_data_roots_create(dirs, &two, &err), 0, "%s", err.message);
	tr_data_roots_describe(two, list, sizeof list);
	snprintf(p, sizeof p, "%s, %s", outside, root);
	cr_assert_str_eq(list, p);
	/* A relative path is looked up in each root in order. */
	int fd = tr_data_open(two, "good.csv", NULL, NULL, 0, &err);
	read_is(fd, "3,4\n");
	fd = tr_data_open(two, "secret.csv", NULL, NULL, 0, &err);
	read_is(fd, "1,2\n");
	tr_data_roots_destroy(two);
}
