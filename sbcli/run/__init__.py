"""A task sequence: each step (grow, learn, remember, evaluate, record), its plan, test sets, results."""
