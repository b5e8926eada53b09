"""The persisted learner: its state, the checks at load, the preflight, the test sample, the store."""
