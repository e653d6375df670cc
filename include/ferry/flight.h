/* ferry/flight.h - (being written) */
#ifndef FERRY_FLIGHT_H
#define FERRY_FLIGHT_H
#include "ferry/task.h"
#endif
