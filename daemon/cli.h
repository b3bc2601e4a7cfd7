/* Sub-commands of the trainerd executable. */
#ifndef TR_DAEMON_CLI_H
#define TR_DAEMON_CLI_H

#include <stdio.h>

#include "engine/trainer.h"

/* trainerd run JOB.json [...]: one job in the foreground. */
int tr_cmd_run(int argc, char **argv);

/* trainerd serve [...]: the daemon. */
int tr_cmd_serve(int argc, char **argv);

/* Terminal progress: a redrawn bar on a TTY, a plain line every few
 * seconds otherwise. */
struct tr_progress_display {
	FILE *out;
	int is_tty;
	double last_print;
	int printed_bar;
};
void tr_progress_init(struct tr_progress_display *d, FILE *out);
void tr_progress_update(struct tr_progress_display *d, const struct tr_progress *p);
void tr_progress_finish(struct tr_progress_display *d);

#endif
