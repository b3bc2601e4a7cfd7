/* trainctl's event-stream parser (cli/sse.c): events split at any byte,
 * multi-line data, comments, CR, LF and CRLF line ends, the last id kept
 * for Last-Event-ID, and a frame cut short never dispatched. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cli/trainctl.h"

struct seen {
	char log[2048];
	int n;
};

static bool record(const char *event, const char *id, const char *data, void *ud)
{
	struct seen *s = ud;
	size_t used = strlen(s->log);

	snprintf(s->log + used, sizeof s->log - used, "[%s|%s|%s]", event, id, data);
	s->n++;
	return true;
}

static const char stream[] = "retry: 3000\n\n"
			     ": keepalive\n\n"
			     "id: 7\nevent: state\ndata: {\"state\":\"running\"}\n\n"
			     "id: 8\nevent: log\ndata: line one\ndata: line two\n\n"
			     "id: 9\ndata: plain\n\n";
static const char want[] = "[state|7|{\"state\":\"running\"}][log|8|line one\nline two][message|9|plain]";

Test(sse, whole_stream)
{
	struct seen s = {0};
	struct tr_sse p;

	tr_sse_init(&p, record, &s);
	cr_assert(tr_sse_feed(&p, stream, strlen(stream)));
	cr_assert_str_eq(s.log, want);
	cr_assert_str_eq(p.last_id, "9");
	tr_sse_finish(&p);
}

Test(sse, split_at_every_byte)
{
	for (size_t cut = 1; cut < strlen(stream); cut++) {
		struct seen s = {0};
		struct tr_sse p;

		tr_sse_init(&p, record, &s);
		tr_sse_feed(&p, stream, cut);
		tr_sse_feed(&p, stream + cut, strlen(stream) - cut);
		cr_assert_str_eq(s.log, want, "split at %zu", cut);
		tr_sse_finish(&p);
	}
}

Test(sse, crlf_and_cr_line_ends_across_pieces)
{
	const char *pieces[] = {"id: 1\r", "\nevent: a\r\ndata: x\r", "\r", "id: 2\rdata: y\r\r", NULL};
	struct seen s = {0};
	struct tr_sse p;

	tr_sse_init(&p, record, &s);
	for (int i = 0; pieces[i]; i++)
		tr_sse_feed(&p, pieces[i], strlen(pieces[i]));
	cr_assert_str_eq(s.log, "[a|1|x][message|2|y]");
	tr_sse_finish(&p);
}

Test(sse, a_cut_frame_is_not_dispatched)
{
	const char cut[] = "id: 5\nevent: log\ndata: whole\n\nid: 6\nevent: log\ndata: cut sh";
	struct seen s = {0};
	struct tr_sse p;

	tr_sse_init(&p, record, &s);
	tr_sse_feed(&p, cut, strlen(cut));
	cr_assert_eq(s.n, 1);
	cr_assert_str_eq(s.log, "[log|5|whole]");
	cr_assert_str_eq(p.last_id, "5", "a reconnect must ask for event 6 again");
	tr_sse_finish(&p);
}
