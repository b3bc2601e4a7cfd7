/* A Server-Sent Events parser (the WHATWG event stream format) for
 * `watch` and `logs -f`: lines end in LF, CRLF or CR; "field: value"
 * lines build an event; a blank line dispatches it; comments (":") are
 * keepalives.  Bytes arrive in arbitrary pieces, so a partial line is
 * kept until its end comes.  The last id seen is what a reconnect sends
 * as Last-Event-ID.
 */
#include "cli/trainctl.h"

#include <stdlib.h>
#include <string.h>

void tr_sse_init(struct tr_sse *p, bool (*on_event)(const char *, const char *, const char *, void *), void *ud)
{
	memset(p, 0, sizeof(*p));
	p->on_event = on_event;
	p->ud = ud;
}

void tr_sse_finish(struct tr_sse *p)
{
	free(p->line);
	free(p->data);
	p->line = p->data = NULL;
	p->len = p->cap = p->dlen = p->dcap = 0;
}

static bool grow(char **buf, size_t *cap, size_t need)
{
	size_t ncap = *cap ? *cap : 256;
	char *nb;

	if (need <= *cap)
		return true;
	while (ncap < need)
		ncap *= 2;
	nb = realloc(*buf, ncap);
	if (!nb)
		return false;
	*buf = nb;
	*cap = ncap;
	return true;
}

static bool dispatch(struct tr_sse *p)
{
	bool go = true;

	/* The id counts once its frame is whole: a reconnect after a cut
	 * frame must ask for that frame again. */
	memcpy(p->last_id, p->id, sizeof(p->last_id));
	if (p->dlen > 0) {
		p->data[p->dlen - 1] = '\0'; /* the last data line's "\n" */
		go = p->on_event(p->event[0] ? p->event : "message", p->id, p->data, p->ud);
	}
	p->dlen = 0;
	p->event[0] = '\0';
	return go;
}

static void copy_field(char *dst, size_t cap, const char *v, size_t n)
{
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, v, n);
	dst[n] = '\0';
}

static bool line(struct tr_sse *p, const char *s, size_t n)
{
	const char *colon;
	size_t flen, vlen;
	const char *v;

	if (n == 0)
		return dispatch(p);
	if (s[0] == ':')
		return true;
	colon = memchr(s, ':', n);
	flen = colon ? (size_t)(colon - s) : n;
	v = colon ? colon + 1 : s + n;
	vlen = colon ? n - flen - 1 : 0;
	if (vlen && *v == ' ')
		v++, vlen--;
	if (flen == 4 && memcmp(s, "data", 4) == 0) {
		if (!grow(&p->data, &p->dcap, p->dlen + vlen + 2))
			return false;
		memcpy(p->data + p->dlen, v, vlen);
		p->dlen += vlen;
		p->data[p->dlen++] = '\n';
	} else if (flen == 5 && memcmp(s, "event", 5) == 0) {
		copy_field(p->event, sizeof(p->event), v, vlen);
	} else if (flen == 2 && memcmp(s, "id", 2) == 0) {
		copy_field(p->id, sizeof(p->id), v, vlen);
	}
	return true;
}

bool tr_sse_feed(struct tr_sse *p, const char *buf, size_t len)
{
	for (size_t i = 0; i < len && !p->stop; i++) {
		char ch = buf[i];
		bool after_cr = p->after_cr;

		p->after_cr = ch == '\r';
		if (ch == '\n' || ch == '\r') {
			/* A CRLF's LF ends nothing: the CR did (also when the two
			 * arrive in different pieces). */
			if (ch == '\n' && after_cr)
				continue;
			if (!line(p, p->line ? p->line : "", p->len))
				p->stop = true;
			p->len = 0;
			continue;
		}
		if (!grow(&p->line, &p->cap, p->len + 1)) {
			p->stop = true;
			break;
		}
		p->line[p->len++] = ch;
	}
	return !p->stop;
}
