#include <jansson.h>

/* The engine uses json_object_getn and json_object_iter_key_len (jansson
 * 2.14, Debian 12's libjansson-dev), and its JSON validator follows 2.14's
 * parser rule for rule (Sources/CFetchQSupport/json_walk.c). */
#if JANSSON_VERSION_HEX < 0x020e00
#error "fetchq needs jansson 2.14 or later (apt-get install libjansson-dev on Debian 12)"
#endif
