/* Sub-commands of the trainerd executable. */
#ifndef TR_DAEMON_CLI_H
#define TR_DAEMON_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/checkpoint.h"
#include "engine/model_meta.h"
#include "engine/trainer.h"

/* trainerd run JOB.json [...]: one job in the foreground. */
int tr_cmd_run(int argc, char **argv);
/* daemon/run_procs.c: replaces the process with `mpirun -n nproc trainerd
 * run ARGV...` (argv[0] is "run"); returns 1 only when that fails. */
int tr_run_launch(int nproc, int argc, char **argv);
/* A rank's watchdog (daemon/run_procs.c): exits the process when no beat
 * came for timeout_s seconds; beat after each step; stop before the end. */
int tr_run_watchdog_start(int timeout_s, int rank, int nproc);
void tr_run_watchdog_beat(void);
void tr_run_watchdog_stop(void);

/* trainerd run's checkpoint in its output directory (run_ckpt.c): written
 * atomically (temporary file, fsync, rename), read back by --resume. */
#define TR_RUN_CKPT_NAME "checkpoint.safetensors"
int tr_run_ckpt_write(const char *dir, const tr_model_t *m, enum tr_optim_type opt, const struct tr_snapshot *snap,
		      struct tr_error *err);
int tr_run_ckpt_read(const char *dir, const tr_model_t *m, enum tr_optim_type opt, struct tr_snapshot **out,
		     struct tr_error *err);
/* Drops the points after `step` from a metrics.jsonl (a missing file is
 * fine): the resumed run writes them again. */
int tr_run_metrics_truncate(const char *path, int64_t step);

/* trainerd eval MODEL DATA_SPEC and trainerd predict MODEL INPUT --out
 * FILE (eval_cmd.c): a trained model on labelled data or plain inputs. */
int tr_cmd_eval(int argc, char **argv);
int tr_cmd_predict(int argc, char **argv);

/* trainerd degrade IN OUT --factor F | --noise SIGMA (degrade_cmd.c):
 * the training degradation on whole images. */
int tr_cmd_degrade(int argc, char **argv);

/* The .npy header (version 1.0) of a float32 C-order array of the given
 * shape, padded so the data starts at a multiple of 64 bytes.  Returns 0
 * or -1 (a write failed). */
int tr_npy_write_header(FILE *f, const int64_t *shape, int ndim);

/* trainerd predict MODEL IN --out DIR/ for an image-to-image model
 * (predict_images.c): one output image per input image. */
struct tr_predict_images {
	const struct tr_model_desc *desc; /* free_hw, pixels recorded, weights loaded */
	tr_backend_t *backend;
	int devices, tile, batch, workers; /* 0: defaults */
	const char *in_dir;                /* the folder of the inputs */
	const char *one_file;              /* NULL: every image of in_dir; else this one in it */
	const char *out_dir;
	bool npy;     /* float32 .npy instead of PNG */
	bool degrade; /* apply the recorded degradation first */
};
/* Returns the exit status (0, 1 run-time failure, 2 bad input), having
 * printed what went wrong. */
int tr_predict_images_run(const struct tr_predict_images *o);

/* trainerd serve [...]: the daemon. */
int tr_cmd_serve(int argc, char **argv);

/* Terminal progress: a redrawn bar on a TTY, a plain line every few
 * seconds otherwise; either way one summary line per epoch that stays in
 * the scrollback. */
struct tr_progress_display {
	FILE *out;
	int is_tty;
	double last_print;
	int printed_bar;
	/* The latest validation figures (NAN until the first) and the epoch
	 * they belong to. */
	double val_loss, val_accuracy;
	int64_t val_epoch;
	/* The epoch in progress: its loss sum and step count, and its last
	 * progress report, for the summary line. */
	struct tr_progress prev;
	int have_prev;
	double epoch_loss_sum;
	int64_t epoch_loss_n;
	/* The last step has been reported; its epoch's line waits for
	 * tr_progress_finish, so that the final evaluation's figures, which
	 * the trainer emits after the step's progress, are on it. */
	int last_pending;
};
void tr_progress_init(struct tr_progress_display *d, FILE *out);
void tr_progress_update(struct tr_progress_display *d, const struct tr_progress *p);
/* Records a validation metric ("val_loss", "val_accuracy"; others are
 * ignored) for the progress line and the epoch's summary. */
void tr_progress_metric(struct tr_progress_display *d, const char *name, int64_t epoch, double value);
void tr_progress_finish(struct tr_progress_display *d);

#endif
