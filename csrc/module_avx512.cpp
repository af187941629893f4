// The FlashAttention kernel built as ortflash.kernels._flash_avx512; setup.py picks this file's ISA flags.
#define ORTFLASH_MODULE_NAME _flash_avx512
#include "flash_attention.hpp"
