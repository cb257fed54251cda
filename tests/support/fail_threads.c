/* A fault for tests, loaded with LD_PRELOAD: pthread_create refuses
 * (EAGAIN, as at a container's pids limit) once DSTK_TEST_THREADS_LEFT
 * threads have been started; unset, every thread starts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

static atomic_long left = -2; /* -2: not read yet; -1: no limit */

int pthread_create(pthread_t* t, const pthread_attr_t* a, void* (*f)(void*), void* arg) {
    static int (*real)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
    if (!real) real = (int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*))dlsym(RTLD_NEXT, "pthread_create");
    long expected = -2;
    if (atomic_load(&left) == -2) {
        const char* v = getenv("DSTK_TEST_THREADS_LEFT");
        atomic_compare_exchange_strong(&left, &expected, v ? atol(v) : -1);
    }
    for (;;) {
        long n = atomic_load(&left);
        if (n < 0) break;
        if (n == 0) return EAGAIN;
        if (atomic_compare_exchange_weak(&left, &n, n - 1)) break;
    }
    return real(t, a, f, arg);
}
