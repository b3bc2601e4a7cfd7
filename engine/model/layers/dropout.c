/* dropout: inverted dropout, any shape.  The mask is keyed by (seed,
 * step, node index) and each element's position in the step's global
 * sample list, so it does not depend on how the step was split
 * (docs/design.md, "Randomness"); it is kept for backward. */
#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"
#include "engine/rng.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	(void)err;
	l->out_shape = l->in_shape;
	l->rate = s->rate;
	l->saved[0] = (size_t)l->in; /* the mask */
	return 0;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	const tr_backend_i *bi = r->be->i;
	if (p->training && l->rate > 0.0f) {
		uint64_t key = tr_rng_key(r->model->seed, (uint64_t)p->step, (uint64_t)l->index, TR_RNG_DROPOUT);
		return bi->dropout_forward(r->be, r->dev, p->rows, l->out, l->rate, key, p->row0, x, y,
					   r->aux[l->index]);
	}
	return bi->copy(r->be, r->dev, y, x, (size_t)p->rows * l->out * sizeof(float));
}

/* The forward mask is only valid if the forward used it; eval passes never
 * reach backward. */
static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	size_t n = (size_t)p->rows * l->out;
	(void)x, (void)y;
	if (!dx)
		return 0;
	if (l->rate > 0.0f)
		return r->be->i->mul(r->be, r->dev, n, dy, r->aux[l->index], dx);
	return r->be->i->copy(r->be, r->dev, dx, dy, n * sizeof(float));
}

#define LAY(m) offsetof(struct tr_layer_spec, m)

static const struct tr_field tr_layer_dropout_fields[] = {
	{.key = "rate", .kind = K_FLOAT, .off = LAY(rate), .flags = F_REQ | UNIT_OPEN, .lo = 0, .hi = 1},
	{0},
};

const tr_layer_i tr_layer_dropout = {
	.fields = tr_layer_dropout_fields,
	.name = "dropout",
	.type = TR_LAYER_DROPOUT,
	.setup = setup,
	.forward = forward,
	.backward = backward,
};
