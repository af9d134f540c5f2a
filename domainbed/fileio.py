"""Atomic file writes: re-exported from :mod:`oodutils.fileio`, where they live (shared by
every package). Existing ``from domainbed.fileio import ...`` keeps working."""
from oodutils.fileio import (
    atomic_move_aside,
    atomic_savez,
    atomic_torch_save,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_output_path,
    current_umask,
    finite_json,
    fsync_directory,
)

__all__ = ["atomic_move_aside", "atomic_savez", "atomic_torch_save", "atomic_write_bytes",
           "atomic_write_json", "atomic_write_text", "check_output_path", "current_umask",
           "finite_json", "fsync_directory"]
