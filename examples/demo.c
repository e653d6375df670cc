#include <stdio.h>
#include "examples.h"
int main(void) { return ex_hello() | ex_race_lock(); }
