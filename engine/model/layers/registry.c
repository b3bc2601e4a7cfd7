/* The one list of layer types (engine/model/layer.h).  Adding a layer:
 * write its file in this folder, add its enum value (engine/spec.h) and its
 * spec fields (engine/spec.c's layer table), and list it here. */
#include <string.h>

#include "engine/model/layer.h"

static const tr_layer_i *const registry[] = {
	&tr_layer_dense,           &tr_layer_relu,      &tr_layer_gelu,     &tr_layer_tanh,      &tr_layer_sigmoid,
	&tr_layer_dropout,         &tr_layer_layernorm, &tr_layer_conv2d,   &tr_layer_maxpool2d, &tr_layer_avgpool2d,
	&tr_layer_global_avg_pool, &tr_layer_flatten,   &tr_layer_residual, &tr_layer_groupnorm, &tr_layer_batchnorm2d,
};

#define N_REGISTERED ((int)(sizeof registry / sizeof registry[0]))

const tr_layer_i *tr_layer_ops_at(int i)
{
	return i >= 0 && i < N_REGISTERED ? registry[i] : NULL;
}

const tr_layer_i *tr_layer_ops_for(enum tr_layer_type type)
{
	for (int i = 0; i < N_REGISTERED; i++)
		if (registry[i]->type == type)
			return registry[i];
	return NULL;
}

const tr_layer_i *tr_layer_ops_named(const char *name)
{
	for (int i = 0; i < N_REGISTERED; i++)
		if (strcmp(registry[i]->name, name) == 0)
			return registry[i];
	return NULL;
}
