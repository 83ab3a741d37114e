/* capture.h — what a test's code writes to stderr (its log lines), as a string: stderr goes to
 * a temporary file between capture_begin and capture_end. Header-only: include it once per test
 * binary; one capture at a time. */
#ifndef SF_TESTS_CAPTURE_H
#define SF_TESTS_CAPTURE_H

#include <stdio.h>
#include <unistd.h>

static int capture_saved_fd_ = -1;
static char capture_buf_[16384];

static void capture_begin(void)
{
    fflush(stderr);
    capture_saved_fd_ = dup(2);
    FILE *f = tmpfile();
    if (!f) return; /* stderr stays as it was; capture_end then returns "" */
    dup2(fileno(f), 2); /* the file stays open through fd 2 */
    fclose(f);
}

/* Restores stderr; returns what was written since capture_begin (its first 16 KiB). */
static const char *capture_end(void)
{
    fflush(stderr);
    off_t n = lseek(2, 0, SEEK_CUR);
    ssize_t got = 0;
    if (n > 0 && lseek(2, 0, SEEK_SET) == 0)
        got = read(2, capture_buf_, (size_t)n < sizeof capture_buf_ - 1 ? (size_t)n : sizeof capture_buf_ - 1);
    capture_buf_[got > 0 ? got : 0] = 0;
    if (capture_saved_fd_ >= 0) {
        dup2(capture_saved_fd_, 2);
        close(capture_saved_fd_);
        capture_saved_fd_ = -1;
    }
    return capture_buf_;
}

#endif
