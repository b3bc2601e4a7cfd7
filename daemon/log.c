/* Daemon logging (see log.h).  One fprintf per line keeps lines from
 * different threads whole. */
#include "daemon/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/error.h"
#include "core/rfc3339.h"

#ifdef TR_HAVE_SYSTEMD
#include <systemd/sd-journal.h>
#endif

static atomic_int max_level = TR_LOG_INF;
static atomic_bool with_times;
static bool journal;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* As systemd's own tools decide (sd-journal's stderr_is_journal): the
 * variable alone is not enough, since it is inherited by children whose
 * stderr a person redirected. */
static void detect(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2 || fstat(2, &st) < 0)
		return;
	journal = (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void tr_log_init(void)
{
	pthread_once(&once, detect);
}

bool tr_log_to_journal(void)
{
	tr_log_init();
	return journal;
}

void tr_log_set_level(int level)
{
	atomic_store(&max_level, level);
}

int tr_log_level(void)
{
	return atomic_load(&max_level);
}

void tr_log_set_times(bool on)
{
	atomic_store(&with_times, on);
}

static void emit(int level, const char *raw)
{
	char when[TR_RFC3339_LEN + 1] = "";
	char msg[4096];
	struct timespec ts;

	/* A data path's ESC or newline stays on its line, harmless. */
	tr_escape_controls(raw, msg, sizeof msg);

	if (tr_log_to_journal()) {
		fprintf(stderr, "<%d>%s\n", level, msg);
		return;
	}
	if (atomic_load(&with_times) && clock_gettime(CLOCK_REALTIME, &ts) == 0 &&
	    tr_rfc3339_format((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9, when, sizeof when - 1))
		strcat(when, " ");
	fprintf(stderr, "%strainerd: %s%s\n", when,
		level <= TR_LOG_ERR    ? "error: "
		: level == TR_LOG_WARN ? "warning: "
				       : "",
		msg);
}

void tr_log(int level, const char *fmt, ...)
{
	if (level > atomic_load(&max_level))
		return;
	char buf[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	emit(level, buf);
}

void tr_log_job(int level, long long job_id, const char *fmt, ...)
{
	if (level > atomic_load(&max_level))
		return;
	char msg[2048], buf[2100];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	char esc[2048];
	tr_escape_controls(msg, esc, sizeof esc);
	snprintf(buf, sizeof buf, "job %lld: %s", job_id, esc);
#ifdef TR_HAVE_SYSTEMD
	if (tr_log_to_journal() && sd_journal_send("MESSAGE=%s", buf, "PRIORITY=%d", level, "TRAINERD_JOB_ID=%lld",
						   job_id, "SYSLOG_IDENTIFIER=trainerd", NULL) >= 0)
		return;
#endif
	emit(level, buf);
}
