/* An LD_PRELOAD shim for the chaos suite: the wall clock (CLOCK_REALTIME and its coarse
 * variant, gettimeofday, time) of the process it is loaded into runs at an offset read from
 * the file named by UNSKIT_CHAOS_CLOCK_FILE (milliseconds, as text), re-read at most every
 * 50 ms of monotonic time. The monotonic clocks are untouched, as on a host whose clock is
 * stepped. Only raw syscalls in the read path: it may run inside any libc caller. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CHECK_EVERY_NS 50000000LL

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static const char *offset_file;
static _Atomic long long offset_ns;
static _Atomic long long next_check_ns;

static int raw_clock_gettime(clockid_t clock, struct timespec *ts) {
    if (real_clock_gettime == NULL) {
        return (int)syscall(SYS_clock_gettime, clock, ts);
    }
    return real_clock_gettime(clock, ts);
}

__attribute__((constructor)) static void init(void) {
    real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    offset_file = getenv("UNSKIT_CHAOS_CLOCK_FILE");
}

static long long current_offset(void) {
    if (offset_file == NULL) {
        return 0;
    }
    struct timespec mono;
    raw_clock_gettime(CLOCK_MONOTONIC, &mono);
    long long now = mono.tv_sec * 1000000000LL + mono.tv_nsec;
    long long due = atomic_load(&next_check_ns);
    if (now >= due && atomic_compare_exchange_strong(&next_check_ns, &due, now + CHECK_EVERY_NS)) {
        int fd = (int)syscall(SYS_openat, AT_FDCWD, offset_file, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char text[32];
            long got = (long)syscall(SYS_read, fd, text, sizeof text - 1);
            syscall(SYS_close, fd);
            if (got > 0) {
                text[got] = '\0';
                atomic_store(&offset_ns, strtoll(text, NULL, 10) * 1000000LL);
            }
        }
    }
    return atomic_load(&offset_ns);
}

static void shift(struct timespec *ts) {
    long long total = ts->tv_sec * 1000000000LL + ts->tv_nsec + current_offset();
    ts->tv_sec = total / 1000000000LL;
    ts->tv_nsec = total % 1000000000LL;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc = raw_clock_gettime(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
