/* How an error message travels to a user (docs/design.md, "Errors").
 *
 * A function that can fail returns 0 or a negative errno-style code; when
 * a person will read why, it also takes a `struct tr_error *` from its
 * caller and fills it on failure: the message (a whole sentence that
 * names what and where), the JSON pointer into the document at fault
 * ("" when none) and, for job operations, the domain error kind
 * (core/job.h) from which the API picks the HTTP status.  The caller owns
 * the struct (usually on its stack); nothing is allocated, so filling it
 * cannot fail, and nothing is kept per thread.
 */
#ifndef TR_CORE_ERROR_H
#define TR_CORE_ERROR_H

#include <stddef.h>

struct tr_error {
	int kind;          /* a domain error kind (enum tr_job_err), 0 = none */
	char pointer[256]; /* JSON pointer, "" for none */
	char message[768]; /* UTF-8, a trailing cut sequence removed */
};

/* Every problem found in one document, for a client that shows them all
 * at once (a job spec's fields, docs/design.md §5).  The first is also the
 * one a struct tr_error beside it reports.  Bounded: the check stops at
 * the first problem past TR_ERROR_LIST_MAX and sets `more`.  About 33 KiB:
 * give it a heap allocation, not a stack slot. */
#define TR_ERROR_LIST_MAX 32
struct tr_error_list {
	int n;    /* entries in e */
	int more; /* 1: at least one more was found (and not kept) */
	struct tr_error e[TR_ERROR_LIST_MAX];
};

/* Fills e (may be NULL) with kind, pointer (NULL = "") and the formatted
 * message; returns `ret`, so that a caller can write
 * `return tr_error_set(e, -EINVAL, kind, ptr, "...")`. */
int tr_error_set(struct tr_error *e, int ret, int kind, const char *pointer, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* Cuts a trailing incomplete UTF-8 sequence that truncation may leave. */
void tr_error_utf8_trim(char *s);
/* Control characters (bytes below 0x20 but tab, and 0x7f) that a data path or a
 * file's bytes bring into a message would reach terminals (ESC sequences,
 * BEL) and split log lines: they are written as "\xNN".  Copies in to out
 * (cap bytes with the NUL, cut at a whole character) and returns the
 * length.  Every message is made so: tr_error_set, tr_job_fail, job log
 * lines (storage) and the daemon's log. */
size_t tr_escape_controls(const char *in, char *out, size_t cap);
/* The same in place, for s of cap bytes (messages up to 4 KiB). */
void tr_error_escape_controls(char *s, size_t cap);

#endif
