/* Checkpoints: a host snapshot of a trainer and its safetensors layout.
 *
 * A checkpoint is one safetensors file: the parameters under their PyTorch
 * names, then the optimizer state ("optimizer.exp_avg.<name>",
 * "optimizer.exp_avg_sq.<name>" for Adam/AdamW,
 * "optimizer.momentum_buffer.<name>" for SGD with momentum), and in
 * __metadata__ the resume position (step, epoch), spec hash, device count,
 * backend and build version.  The parameters come first in the data region
 * and in one contiguous run, so the weights-only file (model.safetensors)
 * is a different header followed by a prefix of the same data: a download
 * can stream it from the stored checkpoint without rewriting anything.
 *
 * Because all randomness is counter-based and the batch plan is a pure
 * function of the step, (parameters, optimizer state, step) is the whole
 * training state: a trainer resumed from it continues bit-identically on
 * the same devices and build.
 */
#ifndef TR_CHECKPOINT_H
#define TR_CHECKPOINT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "engine/model/model.h"
#include "engine/spec.h"

struct tr_snapshot {
	int64_t step;  /* updates done; training resumes at this 0-based step */
	int64_t epoch; /* epoch of the last step done */
	size_t n_params;
	int n_state;     /* optimizer state buffers: 0, 1 or 2 */
	float *params;   /* n_params floats, malloc'd */
	float *state[2]; /* n_params floats each, malloc'd */
	json_t *meta;    /* object of strings; owned */
	/* Set when the buffers above are a trainer's own, lent rather than
	 * copied (see "Zero-copy snapshots" below); tr_snapshot_free then
	 * drops this reference instead of freeing them. */
	struct tr_snapshot_lease *lease;
};

/* A snapshot with uninitialised buffers for n_params floats and n_state
 * (0-2) optimizer buffers, meta NULL; NULL when out of memory.  Buffers
 * come from the spares that tr_snapshot_free keeps when their size fits:
 * reusing them spares the training thread the page faults of fresh ones. */
struct tr_snapshot *tr_snapshot_alloc(size_t n_params, int n_state);
/* Frees the snapshot; its buffers are kept as spares for the next
 * snapshot of the same size (one snapshot's worth at most, process-wide).
 * Accepts NULL. */
void tr_snapshot_free(struct tr_snapshot *s);
/* Allocates a snapshot's buffers, faults their pages in and keeps them as
 * spares (as tr_snapshot_free does), so that a job's first snapshot is a
 * plain copy: a trainer calls it before its first step when it will take
 * periodic checkpoints.  Best effort: does nothing without the memory. */
void tr_snapshot_prepare(size_t n_params, int n_state);
/* Frees the spare buffers (after a job's last checkpoint). */
void tr_snapshot_trim(void);
/* One buffer of n floats from the spares (64-byte aligned, released with
 * free()), or freshly allocated; NULL when out of memory.  put hands it
 * back to the spares (or frees it); accepts NULL. */
float *tr_snapshot_buffer_take(size_t n);
void tr_snapshot_buffer_put(float *p, size_t n);

/* Zero-copy snapshots.  Where device memory is host memory (the CPU
 * backend), copying rank 0's parameters and optimizer state at every
 * checkpoint would cost the training thread a pass over the whole model;
 * instead the trainer lends those very buffers to the snapshot.  Both hold
 * a reference on the lease: the snapshot until its owner frees it (the
 * writer, after the checkpoint is stored), the trainer until its next
 * update has written the new values into other buffers (taken with
 * tr_snapshot_buffer_take), since until then the replica still reads
 * these.  Nobody writes the lent buffers; whichever side lets go last
 * hands them back to the spares.  So the writer may finish before or after
 * that update, and a trainer may end while its snapshot is still out. */
struct tr_snapshot_lease;
/* A lease on bufs[0..nbuf) of n floats each (memory tr_snapshot_buffer_put
 * accepts), holding one reference for the caller; NULL when out of
 * memory. */
struct tr_snapshot_lease *tr_snapshot_lease_new(size_t n, int nbuf, float *const *bufs);
/* A snapshot over the lease's buffers (params, then n_state state
 * buffers), holding a reference of its own; NULL when out of memory. */
struct tr_snapshot *tr_snapshot_borrow(struct tr_snapshot_lease *l, int n_state);
/* Drops one reference; the last returns the buffers.  Accepts NULL. */
void tr_snapshot_lease_drop(struct tr_snapshot_lease *l);

/* How to write a snapshot: `header` (8-byte length + JSON, padded) followed
 * by the segments in order.  model_header is the weights-only file's
 * header; its data is the first params_bytes bytes of the data region. */
struct tr_checkpoint_layout {
	uint8_t *header;
	size_t header_len;
	uint8_t *model_header;
	size_t model_header_len;
	const void *seg[3];
	size_t seg_len[3];
	int nseg;
	size_t params_bytes;
	size_t total_bytes; /* header_len + all segments */
};

int tr_checkpoint_layout(const tr_model_t *m, enum tr_optim_type opt, const struct tr_snapshot *s,
			 struct tr_checkpoint_layout *out, struct tr_error *err);
void tr_checkpoint_layout_finish(struct tr_checkpoint_layout *l);

/* Parses a checkpoint image (borrowed) into a new snapshot for model m and
 * optimizer opt; names and shapes are checked, errors name the tensor.
 * weights_only reads just the parameters (n_state 0), for a checkpoint of
 * another job that may have used another optimizer. */
int tr_checkpoint_parse(const void *data, size_t len, const tr_model_t *m, enum tr_optim_type opt, bool weights_only,
			struct tr_snapshot **out, struct tr_error *err);

/* A stable hash of the normalized spec, hex; for the metadata. */
void tr_spec_hash(const struct tr_spec *spec, char out[17]);

#endif
