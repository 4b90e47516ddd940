/* C helpers of the fetchq fuzz executables. */
#ifndef FETCHQ_CFUZZERDRIVER_H
#define FETCHQ_CFUZZERDRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* libFuzzer's entry point for programs that have their own main()
 * (compiler-rt FuzzerDriver.cpp, since LLVM 11). Linked in by
 * -sanitize=fuzzer; referenced only by builds compiled with -DFUZZING. */
int LLVMFuzzerRunDriver(int *argc, char ***argv,
                        int (*callback)(const uint8_t *data, size_t size));

/* Registers `callback` to run when a sanitizer reports an error and ends the
 * process (__sanitizer_set_death_callback). Returns false when the program
 * was built without a sanitizer runtime. */
bool fq_fuzz_set_sanitizer_death_callback(void (*callback)(void));

#endif
