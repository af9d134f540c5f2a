/* lstat of many paths into rows of int64 (parallel_read.lstat_rows).

   The warm re-collect of a 100,000-run sweep takes 200,000 lstat calls; the call itself
   costs 2-3 us on a virtual machine, and Python's os.lstat about as much again around it
   (the path object, a stat_result with float times). Here each row is the six fields the
   records index keys on, or -1s where the lstat fails, as parallel_read._stat_rows. */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#define FIELDS 6
#if defined(__APPLE__)
#define MTIME st_mtimespec
#define CTIME st_ctimespec
#else
#define MTIME st_mtim
#define CTIME st_ctim
#endif

/* Stat the `count` NUL-terminated paths laid end to end in paths[0:size] into
   out[0:count * FIELDS]; returns how many paths it found within the bytes (count unless
   the bytes end early, which the caller takes as a failure). */
int64_t lstat_rows(const char *paths, int64_t size, int64_t count, int64_t *out) {
    const char *at = paths, *end = paths + size;
    int64_t done = 0;
    for (; done < count && at < end; done++) {
        const char *stop = memchr(at, '\0', (size_t)(end - at));
        if (stop == NULL) break;
        struct stat st;
        int64_t *row = out + done * FIELDS;
        if (lstat(at, &st) == 0) {
            row[0] = (int64_t)st.st_mode;
            row[1] = (int64_t)st.st_size;
            row[2] = (int64_t)st.MTIME.tv_sec * 1000000000 + st.MTIME.tv_nsec;
            row[3] = (int64_t)st.CTIME.tv_sec * 1000000000 + st.CTIME.tv_nsec;
            row[4] = (int64_t)st.st_ino;
            row[5] = (int64_t)st.st_dev;
        } else {
            for (int k = 0; k < FIELDS; k++) row[k] = -1;
        }
        at = stop + 1;
    }
    return done;
}
