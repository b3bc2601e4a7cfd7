/* Daemon logging: one line per message on stderr.
 *
 * When stderr is the journal (systemd sets JOURNAL_STREAM to its
 * device:inode), each line starts with a syslog priority prefix ("<6>"),
 * which journald turns into the entry's priority, and lines about a job
 * go through sd_journal_send with the job id as the field TRAINERD_JOB_ID
 * (journalctl TRAINERD_JOB_ID=17).  Anywhere else (a terminal, a file)
 * lines carry no priority prefix; warnings and errors say so in words,
 * and a daemon's lines (tr_log_set_times) start with their time, RFC 3339
 * UTC as everywhere in the API ("2026-12-01T17:25:34.120Z trainerd:
 * ...").  The journal stamps its entries itself, and `trainerd run` talks
 * to a person at a terminal: neither gets the time.
 */
#ifndef TR_DAEMON_LOG_H
#define TR_DAEMON_LOG_H

#include <stdbool.h>

enum { TR_LOG_ERR = 3, TR_LOG_WARN = 4, TR_LOG_NOTICE = 5, TR_LOG_INF = 6, TR_LOG_DBG = 7 };

/* Decides, once, whether stderr is the journal.  tr_log calls it itself
 * the first time. */
void tr_log_init(void);
bool tr_log_to_journal(void);
void tr_log_set_level(int level);
/* Whether lines not sent to the journal start with their time. */
void tr_log_set_times(bool on);
int tr_log_level(void);
void tr_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A line about one job: "job 17: ..." plus, in the journal, the job id as
 * a field of its own. */
void tr_log_job(int level, long long job_id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
