/* criterion/new/assert.h - part of the Criterion shim: everything is in criterion.h. */
#include "../criterion.h"
