/* ferry/sync.h - (being written) */
#ifndef FERRY_SYNC_H
#define FERRY_SYNC_H
#include "ferry/task.h"
#endif
