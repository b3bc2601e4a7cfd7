/* The token file (see tokens.h).
 *
 * A token is a secret, so it never goes into a message: errors name the
 * file, the line and what is wrong with it.  The permission check is on
 * the open descriptor (fstat), so the file checked is the file read.
 */
#include "daemon/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A token file with more lines than this is not one. */
#define MAX_TOKENS 1024

void tr_tokens_finish(struct tr_token_list *list)
{
	for (size_t i = 0; i < list->n; i++) {
		char *t = (char *)list->v[i].token;
		explicit_bzero(t, strlen(t));
		free(t);
	}
	free(list->v);
	list->v = NULL;
	list->n = 0;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		*--e = 0;
	return s;
}

int tr_secret_file_check(const char *what, const char *path, const struct stat *st, struct tr_error *err)
{
	/* Whoever owns the file chooses the tokens (and can read them). */
	if (st->st_uid != geteuid() && st->st_uid != 0)
		return tr_error_set(err, -EPERM, 0, NULL,
				    "%s %s is owned by uid %u, not by the daemon's user (uid %u) or root: its owner "
				    "chooses the tokens; chown %u %s",
				    what, path, (unsigned)st->st_uid, (unsigned)geteuid(), (unsigned)geteuid(), path);
	if (st->st_mode & (S_IRWXG | S_IRWXO))
		return tr_error_set(err, -EPERM, 0, NULL, "%s %s: mode %04o lets group or others read it; chmod 600 %s",
				    what, path, (unsigned)(st->st_mode & 07777), path);
	return 0;
}

int tr_tokens_load(const char *path, struct tr_token_list *out, struct tr_error *err)
{
	struct stat st;
	char line[4096];
	int lineno = 0, rc = 0;
	FILE *f = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	out->v = NULL;
	out->n = 0;
	if (fd < 0) {
		rc = -errno;
		tr_error_set(err, 0, 0, NULL, "token-file %s: %s", path, strerror(errno));
		return rc;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		tr_error_set(err, 0, 0, NULL, "token-file %s: not a regular file", path);
		close(fd);
		return -EINVAL;
	}
	if (tr_secret_file_check("token-file", path, &st, err) < 0) {
		close(fd);
		return -EPERM;
	}
	if (!(f = fdopen(fd, "r"))) {
		rc = -errno;
		close(fd);
		tr_error_set(err, 0, 0, NULL, "token-file %s: %s", path, strerror(-rc));
		return rc;
	}
	while (rc == 0 && fgets(line, sizeof line, f)) {
		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			tr_error_set(err, 0, 0, NULL, "token-file %s:%d: line longer than %zu characters", path, lineno,
				     sizeof line - 2);
			rc = -EINVAL;
			break;
		}
		char *s = trim(line);
		if (!*s || *s == '#')
			continue;
		char *colon = strchr(s, ':');
		if (!colon) {
			tr_error_set(err, 0, 0, NULL, "token-file %s:%d: expected 'role:token'", path, lineno);
			rc = -EINVAL;
			break;
		}
		char *tok = colon + 1;
		enum tr_api_role role = tr_api_role_parse(s, (size_t)(colon - s));
		if (role == TR_ROLE_NONE) {
			tr_error_set(err, 0, 0, NULL, "token-file %s:%d: unknown role '%.*s' (read, write or admin)",
				     path, lineno, (int)(colon - s) > 32 ? 32 : (int)(colon - s), s);
			rc = -EINVAL;
			break;
		}
		if (!*tok || strpbrk(tok, " \t")) {
			tr_error_set(err, 0, 0, NULL, "token-file %s:%d: the token is empty or has blanks in it", path,
				     lineno);
			rc = -EINVAL;
			break;
		}
		if (out->n >= MAX_TOKENS) {
			tr_error_set(err, 0, 0, NULL, "token-file %s:%d: more than %d tokens", path, lineno,
				     MAX_TOKENS);
			rc = -EINVAL;
			break;
		}
		struct tr_api_token *nv = realloc(out->v, (out->n + 1) * sizeof(*nv));
		char *copy = strdup(tok);
		if (!nv || !copy) {
			free(copy);
			if (nv)
				out->v = nv;
			tr_error_set(err, 0, 0, NULL, "out of memory");
			rc = -ENOMEM;
			break;
		}
		out->v = nv;
		out->v[out->n].role = role;
		out->v[out->n].token = copy;
		out->n++;
	}
	explicit_bzero(line, sizeof line);
	fclose(f);
	if (rc < 0)
		tr_tokens_finish(out);
	return rc;
}

int tr_tokens_equal(const struct tr_token_list *a, const struct tr_token_list *b)
{
	if (a->n != b->n)
		return 0;
	for (size_t i = 0; i < a->n; i++)
		if (a->v[i].role != b->v[i].role || strcmp(a->v[i].token, b->v[i].token) != 0)
			return 0;
	return 1;
}

void tr_tokens_describe(const struct tr_token_list *list, size_t plain_admin, char *buf, size_t len)
{
	size_t count[4] = {0};
	for (size_t i = 0; i < list->n; i++)
		count[list->v[i].role]++;
	count[TR_ROLE_ADMIN] += plain_admin;
	snprintf(buf, len, "%zu read, %zu write, %zu admin", count[TR_ROLE_READ], count[TR_ROLE_WRITE],
		 count[TR_ROLE_ADMIN]);
}
