"""The engine: one training loop, its schedule, best-epoch selection, devices, processes, threads."""
