"""Unwind tables: each executable file's call-frame information (``.eh_frame``, or ``.debug_frame``)
turned into compact rows sorted by PC, for the BPF unwinder that walks stacks without frame pointers."""
