/* Daemon logging: one line per message on stderr with a syslog priority
 * prefix ("<6>"), which journald turns into the entry's priority. */
#ifndef TR_DAEMON_LOG_H
#define TR_DAEMON_LOG_H

enum { TR_LOG_ERR = 3, TR_LOG_WARN = 4, TR_LOG_NOTICE = 5, TR_LOG_INF = 6, TR_LOG_DBG = 7 };

void tr_log_set_level(int level);
void tr_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
