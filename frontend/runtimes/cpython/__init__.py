"""Python frames: finding a process's CPython interpreter and its layout for the BPF walker (bpf/python.c),
and naming the code objects it records (see optrace/pythonlayout.py for the contract between them)."""

FRAME_KIND = "cpython"  # Frame.kind of a Python frame (OpenTelemetry's profile.frame.type for CPython)
