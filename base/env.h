/* env.h - reading ferry's settings from the environment.
 * Thread: any (getenv: not while another thread changes the environment).
 */
#ifndef FERRY_BASE_ENV_H
#define FERRY_BASE_ENV_H

/* The value of environment variable `name` as 1..4096, else `dflt`. */
unsigned ferry__env_unsigned(const char *name, unsigned dflt);

#endif /* FERRY_BASE_ENV_H */
