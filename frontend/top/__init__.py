"""`optrace top`: the live loop (engine), the terminal's keys and the full-screen view."""
