/* Random-access sample readers and the transforms applied after reading.
 *
 * A reader is opened once per job (files are parsed or memory-mapped at
 * open, so format errors surface before training starts, naming file and
 * line) and then read concurrently by the loader threads: `get` must be
 * thread-safe and must not depend on call order.  Samples are returned as
 * float features plus a float label row (a class index for classification,
 * target values for regression).  Readers are a small vtable so tests can
 * supply their own (for example one that fails at a given sample).
 */
#ifndef TR_DATA_READER_H
#define TR_DATA_READER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/spec.h"

typedef struct tr_reader tr_reader_t;

struct tr_reader_info {
	int64_t samples;
	int features;
	int label_dim; /* floats per label row (1 for a class index) */
};

struct tr_reader_i {
	/* x receives info.features floats, y info.label_dim floats.  On error
	 * returns a negative code and writes a message naming the file and the
	 * sample (or line) into err. */
	int (*get)(tr_reader_t *r, int64_t index, float *x, float *y, char *err, size_t errlen);
	void (*destroy)(tr_reader_t *r);
};

struct tr_reader {
	const struct tr_reader_i *i;
	struct tr_reader_info info;
	char name[256]; /* file name or "synthetic", for messages */
};

/* Opens `src`.  Relative paths are joined to base_dir (NULL = as written).
 * job_seed seeds synthetic data when the source has no seed of its own.
 * Returns 0 and *out, or a negative code with a message in err. */
int tr_reader_open(const struct tr_source_spec *src, uint64_t job_seed, const char *base_dir,
		   tr_reader_t **out, char *err, size_t errlen);

static inline int tr_reader_get(tr_reader_t *r, int64_t index, float *x, float *y, char *err, size_t errlen)
{
	return r->i->get(r, index, x, y, err, errlen);
}

void tr_reader_destroy(tr_reader_t *r); /* accepts NULL */

/* Confines every data file readers open from now on to the directories
 * given (absolute, symlink-free; NULL or empty = no confinement): the
 * file actually opened is checked, so a symlink swapped in after the
 * paths were resolved cannot lead outside.  Process-wide; the daemon sets
 * its data roots once.  0 or -ENOMEM. */
int tr_data_confine(const char *const *dirs);

/* Sleeps whatever simulated storage latency (synthetic load_cost_us) the
 * calling thread's reads have owed but not yet slept; call it after a run
 * of tr_reader_get calls whose result is about to be used, so the run is
 * ready no earlier than its samples' full cost.  Cheap when nothing is owed. */
void tr_data_pay_deferred_wait(void);

/* A reader over samples [begin, end) of `base`, which it borrows (base
 * must outlive it).  Used for validation_split. */
tr_reader_t *tr_reader_slice(tr_reader_t *base, int64_t begin, int64_t end);

/* Transforms, in spec order.  standardize computes per-feature mean and
 * std from `train` at create time (std 0 becomes 1). */
typedef struct tr_transforms tr_transforms_t;

int tr_transforms_create(const struct tr_spec *spec, tr_reader_t *train, tr_transforms_t **out, char *err,
			 size_t errlen);
/* Applies to one sample's features in place.  Noise is applied only when
 * `training`; it is keyed by (seed, epoch, sample index) so it is the same
 * whichever thread loads the sample. */
void tr_transforms_apply(const tr_transforms_t *t, float *x, int features, uint64_t seed, int64_t epoch,
			 int64_t sample_index, int training);
void tr_transforms_destroy(tr_transforms_t *t);

#endif
