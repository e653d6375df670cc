/* ferry/bridge.h - (being written) */
#ifndef FERRY_BRIDGE_H
#define FERRY_BRIDGE_H
#include "ferry/task.h"
#endif
