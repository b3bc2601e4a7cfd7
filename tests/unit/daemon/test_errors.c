/* The upload area (storage/datasets.h), the token file (daemon/tokens.h) and
 * a config file holding tokens (daemon/config.h)
 * give their messages through the caller's struct tr_error (core/error.h;
 * docs/design.md, "Errors"): the message names what and where, the kind
 * is none and there is no JSON pointer, whatever the struct held before. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/config.h"
#include "daemon/tokens.h"
#include "storage/datasets.h"

/* A struct as a caller might pass it after an earlier failure. */
static struct tr_error used(void)
{
	struct tr_error e;

	tr_error_set(&e, -1, 7, "/earlier", "an earlier message");
	return e;
}

Test(errors, datasets_message_arrives_in_callers_struct)
{
	char dir[] = "/tmp/trainerd-dserr-XXXXXX";
	struct tr_error e = used();
	tr_datasets_t *d = NULL;
	tr_dataset_upload_t *up = NULL;

	cr_assert_eq(tr_datasets_create("relative/dir", 0, &d, &e), -EINVAL);
	cr_assert_null(d);
	cr_assert_str_eq(e.message, "the datasets directory must be an absolute path");
	cr_assert_eq(e.kind, 0);
	cr_assert_str_eq(e.pointer, "");

	char name[TR_DATASET_NAME_MAX + 1], file[TR_DATASET_NAME_MAX + 1];
	e = used();
	cr_assert_eq(tr_datasets_parse_ref("dataset:mnist/.hidden", name, file, &e), -EINVAL);
	cr_assert_str_eq(e.message, "'dataset:mnist/.hidden': the file name '.hidden' starts with '.'; names are "
				    "letters, digits, '.', '_' and '-', not starting with '.'");
	cr_assert_eq(e.kind, 0);
	cr_assert_str_eq(e.pointer, "");

	cr_assert_not_null(mkdtemp(dir));
	e = used();
	cr_assert_eq(tr_datasets_create(dir, 100, &d, &e), 0, "%s", e.message);
	cr_assert_eq(tr_datasets_upload_begin(d, "mnist", "train.csv", 101, &up, &e), -EFBIG);
	cr_assert_null(up);
	cr_assert_str_eq(e.message, "mnist/train.csv: 101 bytes do not fit the datasets quota of 100 bytes (100 "
				    "left; datasets-max-bytes sets it)");
	cr_assert_str_eq(e.pointer, "");
	e = used();
	cr_assert_eq(tr_datasets_remove(d, "mnist", "train.csv", NULL, &e), -ENOENT);
	cr_assert_str_eq(e.message, "no dataset file mnist/train.csv");
	/* NULL is allowed where no one reads the message. */
	cr_assert_eq(tr_datasets_check_name("file name", "", NULL), -EINVAL);
	tr_datasets_destroy(d);
	rmdir(dir);
}

/* Writes text to a new file in dir with the given mode; its path in path. */
static void write_file(const char *dir, const char *text, mode_t mode, char *path, size_t len)
{
	snprintf(path, len, "%s/tokens", dir);
	unlink(path);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	cr_assert_eq(fchmod(fd, mode), 0);
	close(fd);
}

Test(errors, token_file_message_arrives_in_callers_struct)
{
	char dir[] = "/tmp/trainerd-tkerr-XXXXXX", path[128], want[512];
	struct tr_error e = used();
	struct tr_token_list list = {0};

	cr_assert_not_null(mkdtemp(dir));
	write_file(dir, "read:abc\nboss:secret-token\n", 0600, path, sizeof path);
	cr_assert_eq(tr_tokens_load(path, &list, &e), -EINVAL);
	snprintf(want, sizeof want, "token-file %s:2: unknown role 'boss' (read, write or admin)", path);
	cr_assert_str_eq(e.message, want);
	cr_assert_eq(e.kind, 0);
	cr_assert_str_eq(e.pointer, "");
	cr_assert_null(strstr(e.message, "secret-token"), "a token never goes into a message");
	cr_assert_eq(list.n, 0);

	e = used();
	write_file(dir, "read:abc\n", 0644, path, sizeof path);
	cr_assert_eq(tr_tokens_load(path, &list, &e), -EPERM);
	snprintf(want, sizeof want, "token-file %s: mode 0644 lets group or others read it; chmod 600 %s", path, path);
	cr_assert_str_eq(e.message, want);
	cr_assert_eq(e.kind, 0);

	chmod(path, 0600);
	cr_assert_eq(tr_tokens_load(path, &list, &e), 0, "%s", e.message);
	cr_assert_eq(list.n, 1);
	tr_tokens_finish(&list);
	unlink(path);
	rmdir(dir);
}

/* A token file owned by another user (not root) was accepted: its owner
 * chooses the tokens.  Only testable where this process may chown. */
Test(errors, token_file_of_another_user_is_refused)
{
	char dir[] = "/tmp/trainerd-tkown-XXXXXX", path[128], want[512];
	struct tr_error e = used();
	struct tr_token_list list = {0};

	cr_assert_not_null(mkdtemp(dir));
	write_file(dir, "read:abc\n", 0600, path, sizeof path);
	if (geteuid() != 0) {
		unlink(path);
		rmdir(dir);
		cr_skip_test("changing a file's owner takes root");
	}
	cr_assert_eq(chown(path, 65534, (gid_t)-1), 0);
	cr_assert_eq(tr_tokens_load(path, &list, &e), -EPERM);
	snprintf(want, sizeof want,
		 "token-file %s is owned by uid 65534, not by the daemon's user (uid 0) or root: its owner chooses "
		 "the tokens; chown 0 %s",
		 path, path);
	cr_assert_str_eq(e.message, want);
	cr_assert_eq(list.n, 0);
	unlink(path);
	rmdir(dir);
}

/* A config file holding a token follows the token file's rules; one
 * without a token may stay world-readable (systemd's example config). */
Test(errors, config_file_with_a_token_needs_the_token_file_rules)
{
	char dir[] = "/tmp/trainerd-cferr-XXXXXX", path[128], want[512];
	struct tr_error e = used();
	struct tr_config c;

	cr_assert_not_null(mkdtemp(dir));
	write_file(dir, "log-level = debug\ntoken = secret-token\n", 0644, path, sizeof path);
	tr_config_defaults(&c);
	cr_assert_eq(tr_config_load_file(&c, path, &e), -EPERM);
	snprintf(want, sizeof want, "--config %s: mode 0644 lets group or others read it; chmod 600 %s", path, path);
	cr_assert_str_eq(e.message, want);
	cr_assert_null(strstr(e.message, "secret-token"), "a token never goes into a message");
	tr_config_finish(&c);

	chmod(path, 0600);
	tr_config_defaults(&c);
	cr_assert_eq(tr_config_load_file(&c, path, &e), 0, "%s", e.message);
	cr_assert_eq(c.n_tokens, 1);
	tr_config_finish(&c);

	write_file(dir, "log-level = debug\n", 0644, path, sizeof path);
	tr_config_defaults(&c);
	cr_assert_eq(tr_config_load_file(&c, path, &e), 0, "%s", e.message);
	tr_config_finish(&c);
	unlink(path);
	rmdir(dir);
}
