/* The token file (`token-file`): one `role:token` per line, roles read,
 * write and admin; blank lines and lines starting with '#' are skipped.
 * The file must not be readable or writable by group or others. */
#ifndef TR_DAEMON_TOKENS_H
#define TR_DAEMON_TOKENS_H

#include <stddef.h>
#include <sys/stat.h>

#include "api/api.h"
#include "core/error.h"

struct tr_token_list {
	struct tr_api_token *v; /* tokens owned */
	size_t n;
};

/* The rules for a file that holds tokens (the token file, and a config
 * file with a `token` line): owned by the daemon's user or root, no
 * permission for group or others.  0, or -EPERM with the fix in err. */
int tr_secret_file_check(const char *what, const char *path, const struct stat *st, struct tr_error *err);

/* Reads path into *out (freed with tr_tokens_finish).  0, or a negative
 * errno with a message naming the file and line, never a token, in err
 * (core/error.h; may be NULL). */
int tr_tokens_load(const char *path, struct tr_token_list *out, struct tr_error *err);
void tr_tokens_finish(struct tr_token_list *list);
/* Whether two lists hold the same tokens with the same roles, in order. */
int tr_tokens_equal(const struct tr_token_list *a, const struct tr_token_list *b);
/* "2 read, 1 write, 0 admin" */
void tr_tokens_describe(const struct tr_token_list *list, size_t plain_admin, char *buf, size_t len);

#endif
