/* The keys of a small JSON object, for the Swift OptionReader; not part of
 * the public ABI. */
#ifndef FQ_KEYS_H
#define FQ_KEYS_H

#include <stddef.h>
#include <string.h>

#define FQS_KEYS_MAX 8

/* An options object of up to FQS_KEYS_MAX keys, scanned once: a submit asks
 * for two dozen keys of which the object holds a few, and comparing a
 * length and a few bytes with each of those few is cheaper than hashing the
 * key for jansson. Plain data, stored inline in the reader (no allocation);
 * the lookups are here, on a pointer, because Swift copied a Swift inline
 * array of these for every lookup. */
typedef struct {
    long count;                    /* keys held, 0...FQS_KEYS_MAX */
    unsigned long read;            /* bit i: key i was read */
    const char *key[FQS_KEYS_MAX]; /* `length` bytes (jansson keys may hold NUL) */
    size_t length[FQS_KEYS_MAX];
    void *value[FQS_KEYS_MAX];     /* borrowed json_t * */
} fqs_keys;

/* Adds a key; 0 when FQS_KEYS_MAX are held already. */
static inline int fqs_keys_add(fqs_keys *k, const char *key, size_t length, void *value) {
    if (k->count >= FQS_KEYS_MAX) return 0;
    k->key[k->count] = key;
    k->length[k->count] = length;
    k->value[k->count] = value;
    k->count++;
    return 1;
}

/* The index of the key spelled by the `length` bytes at `key`, or -1. */
static inline long fqs_keys_find(const fqs_keys *k, const char *key, size_t length) {
    for (long i = 0; i < k->count; i++)
        if (k->length[i] == length && (length == 0 || memcmp(k->key[i], key, length) == 0)) return i;
    return -1;
}

/* The key's value, marking it read; NULL when absent. */
static inline void *fqs_keys_take(fqs_keys *k, const char *key, size_t length) {
    long i = fqs_keys_find(k, key, length);
    if (i < 0) return NULL;
    k->read |= 1UL << i;
    return k->value[i];
}

/* The index of the first key not read, or -1. */
static inline long fqs_keys_first_unread(const fqs_keys *k) {
    for (long i = 0; i < k->count; i++)
        if (!(k->read & (1UL << i))) return i;
    return -1;
}

static inline const char *fqs_keys_key(const fqs_keys *k, long i) { return k->key[i]; }
static inline size_t fqs_keys_length(const fqs_keys *k, long i) { return k->length[i]; }

#endif
