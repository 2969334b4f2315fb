"""nvcc and friends: compile checks with placed diagnostics, ptxas resource reports,
theoretical occupancy, and the fast `nvcc -shared` build. Standard library only (the
language server imports this; torch's headers are found without importing torch)."""

from kernel_lsp.toolchain.compile import build_library, clear_cache, compile_check
from kernel_lsp.toolchain.demangle import demangle, function_name
from kernel_lsp.toolchain.nvcc import (
    DEFAULT_ARCH,
    CompileOptions,
    ToolchainError,
    find_nvcc,
    nvcc_command,
    nvcc_version,
    torch_include_paths,
)
from kernel_lsp.toolchain.occupancy import DEFAULT_THREADS_PER_BLOCK, arch_limits, occupancy
from kernel_lsp.toolchain.ptxas import parse_resources

__all__ = [
    "DEFAULT_ARCH",
    "DEFAULT_THREADS_PER_BLOCK",
    "CompileOptions",
    "ToolchainError",
    "arch_limits",
    "build_library",
    "clear_cache",
    "compile_check",
    "demangle",
    "find_nvcc",
    "function_name",
    "nvcc_command",
    "nvcc_version",
    "occupancy",
    "parse_resources",
    "torch_include_paths",
]
