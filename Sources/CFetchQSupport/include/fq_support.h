/* Internal helpers for the Swift engine; not part of the public ABI
 * (the export map hides them). */
#ifndef FQ_SUPPORT_H
#define FQ_SUPPORT_H

#include <stddef.h>

/* The calling thread's last error message (what fq_last_error() returns). */
void fqs_set_last_error(const char *message);
const char *fqs_last_error(void);

/* Which engine, if any, the calling thread is working for (a worker, the
 * delivery thread, or a thread inside fq_engine_dispatch). Used to refuse
 * calls that would wait for themselves. */
void fqs_set_current_engine(const void *engine);
const void *fqs_current_engine(void);

/* The calling worker thread's release list (see ReleaseList.swift); NULL on
 * other threads. */
void fqs_set_current_release_list(void *list);
void *fqs_current_release_list(void);

/* eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); -1 with errno on failure. */
int fqs_eventfd(void);

/* Names the calling thread (at most 15 bytes are kept, as Linux allows). */
void fqs_set_thread_name(const char *name);

#endif
