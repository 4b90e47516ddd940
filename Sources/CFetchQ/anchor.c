/* Anchors the CFetchQ target; the public header is include/fetchq.h. */
#include "fetchq.h"
