/* The state directory (`--state-dir`): checked and locked before the
 * daemon touches anything in it.
 *
 * One daemon per directory: a second one would queue the first one's
 * running job again and run it too (checkpoints interleaved) and its
 * start-up cleanup would delete the first one's uploads in progress.  So
 * the first takes an exclusive lock (flock) on `trainerd.lock` in it for
 * its whole life, and writes its pid there for the second to name.
 *
 * The daemon follows no link it did not make there, which holds only
 * when nobody else can write in the directory: one owned by another user,
 * or writable by group or others, is refused with how to fix it. */
#ifndef TR_DAEMON_STATE_DIR_H
#define TR_DAEMON_STATE_DIR_H

#include "core/error.h"

struct tr_state_dir {
	int dir_fd;  /* the directory, O_DIRECTORY */
	int lock_fd; /* trainerd.lock, flock'ed while open */
};

/* Creates path (0750) if missing, checks its owner and mode, and takes the
 * lock.  0, or a negative errno with the message in err. */
int tr_state_dir_open(const char *path, struct tr_state_dir *sd, struct tr_error *err);
void tr_state_dir_close(struct tr_state_dir *sd);

/* Writes `name` in the directory through `name.tmp`, made with
 * O_CREAT|O_EXCL|O_NOFOLLOW (a stale one from a crash is unlinked first,
 * never followed), then renamed over it.  0 or a negative errno. */
int tr_state_dir_write_file(const struct tr_state_dir *sd, const char *name, const char *text);

#endif
