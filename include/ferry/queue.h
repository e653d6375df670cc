/* ferry/queue.h - (being written) */
#ifndef FERRY_QUEUE_H
#define FERRY_QUEUE_H
#include "ferry/task.h"
#endif
