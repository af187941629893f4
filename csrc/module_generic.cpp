// The FlashAttention kernel built as ortflash.kernels._flash_generic; setup.py picks this file's ISA flags.
#define ORTFLASH_MODULE_NAME _flash_generic
#include "flash_attention.hpp"
