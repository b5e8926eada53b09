"""What a run is set to: options from defaults, a recipe and what was given; named recipes."""
