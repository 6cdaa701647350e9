/* AddressSanitizer's defaults for every program of a CUDA emulation build
 * (compiled into each of them, cmake/cuda_emu.cmake).  MPI libraries keep
 * memory to the end: only out-of-bounds accesses count, not leaks.  A
 * segmentation fault stays a plain SIGSEGV: the 16-bit tables' handles
 * fault on purpose when touched, and their tests expect exactly that. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "detect_leaks=0:handle_segv=0"; }
