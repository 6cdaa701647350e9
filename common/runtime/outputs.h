/* Where a run writes, checked before the first iteration (issue 39): a
 * missing directory, a file that is not a spbench file of the output's kind
 * (replaced only under --overwrite), a device node, a results CSV with a
 * torn last line are refused before any work, not found after it. */
#ifndef SPB_OUTPUTS_H
#define SPB_OUTPUTS_H

#include <stddef.h>

#include "config.h"

/* The kinds of file a run replaces whole (written to a temporary name and
 * renamed) or writes in place. */
typedef enum { SPB_OUT_CHECKPOINT, SPB_OUT_DUMP, SPB_OUT_LOSS_LOG } spb_output_kind;

/* 0 if `path` (given as --`option`) may be written as `kind`: its directory
 * exists and is writable, and what is at path is nothing, a spbench file of
 * that kind, or (overwrite) any regular file; a loss log may also be a
 * character device (/dev/null).  -1 with a one-line message. */
int spb_output_check(const char *option, const char *path, spb_output_kind kind, int overwrite, char *err,
                     size_t errlen);

/* Every output of cfg (--save, --dump and its .ckpt, --loss-log, --results'
 * directory and last line): 0 or -1 with a message.  Rank 0's view. */
int spb_outputs_check(const spb_config *cfg, char *err, size_t errlen);

#endif
