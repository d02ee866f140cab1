"""The ops: per family, ``<op>.py`` declares them (signature, validation, computation over
backend kernels, float64 reference, preference, tolerance) and ``<op>_cases.py`` lists what
exercises them; the machinery beside them (declaration, eager, registry, policy, oracle,
cases)."""
