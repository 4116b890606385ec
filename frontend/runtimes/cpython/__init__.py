"""Python frames: finding a process's CPython interpreter and its layout for the BPF walker (bpf/python.c),
and naming the code objects it records (see optrace/pythonlayout.py for the contract between them)."""
