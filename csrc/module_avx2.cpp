// The FlashAttention kernel built as ortflash.kernels._flash_avx2; setup.py picks this file's ISA flags.
#define ORTFLASH_MODULE_NAME _flash_avx2
#include "flash_attention.hpp"
