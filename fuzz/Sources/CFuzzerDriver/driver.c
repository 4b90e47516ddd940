#include "CFuzzerDriver.h"

/* Weak: defined by the sanitizer runtimes, absent from a plain build. */
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

bool fq_fuzz_set_sanitizer_death_callback(void (*callback)(void)) {
    if (!__sanitizer_set_death_callback) return false;
    __sanitizer_set_death_callback(callback);
    return true;
}
