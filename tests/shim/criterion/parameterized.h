/* Criterion-shim counterpart of <criterion/parameterized.h>: the shim's
 * criterion.h already defines ParameterizedTest and cr_make_param_array. */
#ifndef TR_CRITERION_SHIM_PARAMETERIZED_H
#define TR_CRITERION_SHIM_PARAMETERIZED_H
#include "criterion.h"
#endif
