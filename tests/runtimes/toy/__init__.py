"""A small runtime proving the seam (docs/runtimes.md): registered by the tests only."""
