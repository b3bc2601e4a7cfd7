/* Error replies.  Every failure the API reports, whether found by the
 * server (routing, limits, auth), a handler (parameters, bodies) or the
 * daemon (through struct tr_api_error), leaves through tr_api_fail, so
 * all of them share one shape: {"error": {"code", "message", "pointer"}}
 * with the pointer only when there is one (docs/design.md §8).
 */
#include "api/api_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Cuts a trailing incomplete UTF-8 sequence that vsnprintf truncation may
 * leave: jansson refuses invalid UTF-8 and the error would vanish. */
static void utf8_trim(char *s)
{
	size_t len = strlen(s), j = len, need;
	unsigned char lead;

	while (j > 0 && ((unsigned char)s[j - 1] & 0xC0) == 0x80)
		j--;
	if (j == 0)
		return;
	lead = (unsigned char)s[j - 1];
	if (lead < 0xC0)
		return;
	need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
	if (len - (j - 1) < need)
		s[j - 1] = '\0';
}

void tr_api_fail(struct tr_api_reply *rp, int status, const char *code, const char *pointer, const char *fmt,
		 ...)
{
	char message[1024];
	json_t *error, *msg;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	utf8_trim(message);

	/* Text from elsewhere (a store message, a request parameter) may
	 * still not be UTF-8; a message that says so beats an empty body. */
	msg = json_string(message);
	if (!msg)
		msg = json_string("(message is not valid UTF-8)");
	error = json_pack("{s:s, s:o}", "code", code, "message", msg);
	if (error && pointer && *pointer) {
		json_t *ptr = json_string(pointer);

		json_object_set_new(error, "pointer", ptr ? ptr : json_string("(not valid UTF-8)"));
	}
	json_decref(rp->json);
	rp->json = error ? json_pack("{s:o}", "error", error) : NULL;
	free(rp->text);
	rp->text = NULL;
	rp->text_len = 0;
	if (rp->stream) {
		MHD_destroy_response(rp->stream);
		rp->stream = NULL;
	}
	rp->status = status;
}

void tr_api_fail_op(struct tr_api_reply *rp, const struct tr_api_error *err)
{
	if (err->status < 400 || err->status > 599 || !err->code[0]) {
		tr_api_fail(rp, 500, "internal", err->pointer, "%s",
			    err->message[0] ? err->message : "the daemon refused without saying why");
		return;
	}
	tr_api_fail(rp, err->status, err->code, err->pointer, "%s", err->message);
}

void tr_api_fail_store(struct tr_api_reply *rp, tr_store_t *store, const char *what)
{
	const char *msg = tr_store_error(store);

	tr_api_fail(rp, 500, "internal", NULL, "%s: %s", what, msg && *msg ? msg : "storage error");
}
